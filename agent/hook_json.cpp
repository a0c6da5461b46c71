// Boost.JSON compiled into gpunode-agent-hook.so (Boost's documented header-only use: this one
// file, in one target) instead of mapping libboost_json.so: one shared library fewer for the
// hook to open, map and relocate on every GPU domain start (CONTRACT §9 "Speed").
#include <boost/json/src.hpp>
