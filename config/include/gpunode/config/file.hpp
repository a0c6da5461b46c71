// gpunode/config/file.hpp: reading a whole file the operator gave the agent (agent.yaml, a key
// file), one way for every reader: the agent, check-config, the libvirt hook and gpunodectl. Its
// own translation unit, so that a reader which does not link the YAML parser (the hook's module)
// can use it.
#pragma once

#include <cstddef>
#include <expected>
#include <string>
#include <string_view>

namespace gpunode::config {

// The whole of `path`, a regular file of at most `limit` bytes, or errno: EISDIR for a directory,
// EINVAL for anything else that is not a regular file (a FIFO, a device), EFBIG past `limit` (the
// reading stops there). Opened with O_NONBLOCK, so a FIFO put at the path cannot hang the reader.
std::expected<std::string, int> read_file(const std::string& path, std::size_t limit);
// The same over a descriptor the caller opened (with its own flags: O_NOFOLLOW, openat); read from
// where it stands, not closed.
std::expected<std::string, int> read_file(int fd, std::size_t limit);

// What read_file's error says, for a message: "not a regular file" (EINVAL), "larger than N MiB"
// (or bytes; EFBIG), or strerror's text ("Is a directory" for EISDIR).
std::string read_error_text(int error, std::size_t limit);

// Writes `content` to `path` whole or not at all: a new file beside it (mode `mode`, whatever the
// umask), written and fsync'ed, then renamed over `path` (replace) or linked to it only when
// nothing is there (!replace: EEXIST then, and the existing file is left as it was), and the
// directory fsync'ed. A crash leaves `path` old or new, never partial. errno on failure.
std::expected<void, int> write_file_atomic(const std::string& path, std::string_view content, unsigned mode,
                                           bool replace);

}  // namespace gpunode::config
