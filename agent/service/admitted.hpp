// Domains the libvirt hook's admission let through and libvirt has not yet listed as running
// (CONTRACT §9, the start race). Between `prepare begin` and the domain running, a listing does
// not show it; a reservation created in that window must still see the domain on its units, so
// the create's occupancy check counts these too. Private to gpunode_service; state thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::service::detail {

class AdmittedDomains {
 public:
  // A start takes seconds; one that has not shown up as running after this never started.
  static constexpr std::chrono::seconds kHold{120};
  static constexpr std::size_t kMax = 1024;  // domains starting at once; beyond it, the oldest go

  struct Entry {
    vmctl::Domain domain;  // state "starting"
    std::vector<std::string> unit_ids;
    std::chrono::system_clock::time_point at;
  };

  void admit(vmctl::Domain domain, std::vector<std::string> unit_ids,
             std::chrono::system_clock::time_point now) {
    domain.state = "starting";
    const std::string uuid = domain.uuid;
    entries_.insert_or_assign(uuid, Entry{std::move(domain), std::move(unit_ids), now});
    while (entries_.size() > kMax) {
      auto oldest = entries_.begin();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->second.at < oldest->second.at) oldest = it;
      }
      entries_.erase(oldest);
    }
  }
  // A listing: domains it shows active are covered by it from now on.
  void seen(const std::vector<vmctl::Domain>& listed) {
    for (const auto& d : listed) {
      if (d.active()) entries_.erase(d.uuid);
    }
  }
  // The domains still starting at `now` (expired ones are dropped).
  const std::map<std::string, Entry>& starting(std::chrono::system_clock::time_point now) {
    std::erase_if(entries_, [&](const auto& kv) { return now - kv.second.at > kHold; });
    return entries_;
  }

 private:
  std::map<std::string, Entry> entries_;  // by domain uuid
};

}  // namespace gpunode::service::detail
