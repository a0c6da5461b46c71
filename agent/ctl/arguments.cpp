// gpunodectl's argument checks and conversions (arguments.hpp).
#include "arguments.hpp"

namespace gpunode::ctl {

CLI::Validator time_validator(Time now) {
  return CLI::Validator(
      [now](std::string& s) -> std::string {
        auto t = parse_when(s, now);
        return t ? std::string() : t.error().detail;
      },
      "TIME");
}

CLI::Validator ids_validator(bool may_be_empty) {
  return CLI::Validator(
      [may_be_empty](std::string& s) -> std::string {
        if (may_be_empty && s.empty()) return {};
        auto v = parse_ids(s);
        return v ? std::string() : v.error().detail;
      },
      may_be_empty ? "ID,.. or \"\"" : "ID,..");
}

std::vector<std::string> ids_of(const std::string& s) {
  return s.empty() ? std::vector<std::string>{} : parse_ids(s).value_or(std::vector<std::string>{});
}

Time when_of(const std::string& s, Time now) {
  return parse_when(s, now).value_or(now);
}

}  // namespace gpunode::ctl
