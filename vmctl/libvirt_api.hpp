// libvirt's C API, loaded when the adapter is first made (private to gpunode_vmctl).
//
// The agent does not link libvirt: libvirt.so.0 maps 44 more shared libraries, which every start
// of `gpunode-agent` would pay for, and the commands that never talk to libvirt (`libvirt-hook`,
// run by libvirtd on every domain start; `discover`, `check-config`, `version`) must start fast.
// Each function is looked up once, first in the process (a program or test that links libvirt,
// or stands in for one of its calls, is used as it is), then in libvirt.so.0. The types are
// libvirt's own, taken from its headers, so a call through the table is checked like a direct one.
#pragma once

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include "gpunode/error/error.hpp"

// An X-macro list, laid out by hand: clang-format does not settle on one layout for it.
// clang-format off
#define GPUNODE_LIBVIRT_FUNCTIONS(X)                                                                            \
  X(virInitialize) X(virSetErrorFunc) X(virGetLastError) X(virResetLastError) X(virEventRegisterDefaultImpl)   \
  X(virEventRunDefaultImpl) X(virConnectOpen) X(virConnectClose) X(virConnectIsAlive) X(virConnectSetKeepAlive) \
  X(virConnectListAllDomains) X(virConnectDomainEventRegisterAny) X(virConnectDomainEventDeregisterAny)          \
  X(virConnectRegisterCloseCallback) X(virConnectUnregisterCloseCallback) X(virDomainLookupByUUIDString)         \
  X(virDomainFree) X(virDomainGetUUIDString) X(virDomainGetName) X(virDomainGetState) X(virDomainGetXMLDesc)     \
  X(virDomainGetMetadata) X(virDomainSetMetadata) X(virDomainIsActive) X(virDomainIsPersistent)                 \
  X(virDomainShutdown) X(virDomainDestroy)
// clang-format on

namespace gpunode::vmctl::detail {

struct LibvirtApi {
#define GPUNODE_LIBVIRT_MEMBER(name) decltype(&::name) name = nullptr;
  GPUNODE_LIBVIRT_FUNCTIONS(GPUNODE_LIBVIRT_MEMBER)
#undef GPUNODE_LIBVIRT_MEMBER
};

// The table, loaded on the first call (thread-safe; later calls return the same). The error
// (unavailable: libvirt's library cannot be loaded, or lacks a function) says which is missing.
const error::Result<LibvirtApi>& libvirt_api();

}  // namespace gpunode::vmctl::detail
