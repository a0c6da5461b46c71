// libvirt's errors as the agent's one error: the mapping of libvirt's virErrorNumber to a code,
// here rather than in gpunode::error so that the error library reads no libvirt header (its
// users, down to gpunode-agent's thin main, need no libvirt to build), as vmctl alone meets
// libvirt. libvirt's header is read for its constants only: nothing here calls libvirt.
#include <libvirt/virterror.h>

#include <utility>

#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::vmctl {

using error::Errc;

Errc libvirt_code(int code) {
  switch (code) {
    // The connection is gone or unusable (libvirtd restarted, the socket closed, keepalive gave
    // up, it refused us): a caller answers 503 and tries again later, on a fresh connection.
    // SYSTEM_ERROR too, though libvirt also says it on a live connection: a termination record a
    // full disk refused, a SIGKILL that outlasted libvirt's wait for a guest with GPUs. As
    // unavailable such a termination stays pending and the next listing finishes it truthfully;
    // as any other code it would be a final failure. A needless reconnect is the price.
    case VIR_ERR_NO_CONNECT:
    case VIR_ERR_INVALID_CONN:
    case VIR_ERR_SYSTEM_ERROR:
    case VIR_ERR_RPC:
    case VIR_ERR_OPERATION_TIMEOUT:
    case VIR_ERR_AUTH_FAILED:
    case VIR_ERR_AUTH_CANCELLED:
    case VIR_ERR_AUTH_UNAVAILABLE:
      return Errc::unavailable;
    case VIR_ERR_NO_DOMAIN:
    case VIR_ERR_NO_DOMAIN_SNAPSHOT:
    case VIR_ERR_NO_DOMAIN_CHECKPOINT:
    case VIR_ERR_NO_DOMAIN_METADATA:
    case VIR_ERR_NO_NETWORK:
    case VIR_ERR_NO_STORAGE_POOL:
    case VIR_ERR_NO_STORAGE_VOL:
    case VIR_ERR_NO_NODE_DEVICE:
    case VIR_ERR_NO_SECRET:
      return Errc::not_found;
    case VIR_ERR_OPERATION_INVALID:  // e.g. the domain is not running
    case VIR_ERR_INVALID_ARG:
    case VIR_ERR_XML_ERROR:
    case VIR_ERR_XML_DETAIL:
      return Errc::invalid;
    case VIR_ERR_OPERATION_DENIED:
    case VIR_ERR_ACCESS_DENIED:
      return Errc::permission;
    case VIR_ERR_DOM_EXIST:
      return Errc::exists;
    case VIR_ERR_RESOURCE_BUSY:
      return Errc::busy;
    case VIR_ERR_AGENT_UNRESPONSIVE:
      return Errc::timeout;
    case VIR_ERR_NO_SUPPORT:
    case VIR_ERR_OPERATION_UNSUPPORTED:
    case VIR_ERR_ARGUMENT_UNSUPPORTED:
      return Errc::protocol;
    case VIR_ERR_OK:
    case VIR_ERR_INTERNAL_ERROR:
    case VIR_ERR_NO_MEMORY:
    case VIR_ERR_INVALID_DOMAIN:
      return Errc::internal;
    default:
      return Errc::io;
  }
}

error::Error from_libvirt(int code, std::string detail) {
  return error::Error{libvirt_code(code), std::move(detail), code,
                      code == VIR_ERR_OK ? error::Native::none : error::Native::libvirt};
}

}  // namespace gpunode::vmctl
