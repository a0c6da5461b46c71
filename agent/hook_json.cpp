// Boost.JSON compiled into gpunode-agent (Boost's documented header-only use: this one file, in one
// target) instead of mapping libboost_json.so, which would bring libstdc++.so with it: the hook
// maps libc alone on every GPU domain start (CONTRACT §9 "Speed", module_abi.hpp).
#include <boost/json/src.hpp>
