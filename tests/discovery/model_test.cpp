#include "gpunode/discovery/model.hpp"

#include <doctest/doctest.h>

using gpunode::discovery::PciAddress;

TEST_CASE("PCI addresses parse strictly") {
  auto a = PciAddress::parse("0000:41:00.0");
  REQUIRE(a);
  CHECK(a->bus == 0x41);
  CHECK(a->to_string() == "0000:41:00.0");
  CHECK(PciAddress::parse("000A:C1:1F.7")->to_string() == "000a:c1:1f.7");
  for (const char* bad : {"", "0000:41:00", "41:00.0", "0000:41:00.8", "0000:41:20.0", "0000:zz:00.0",
                          "0000:41:00.0 ", "garbage", "0000-41-00-0", "00000:41:00.0", "+000:41:00.0"}) {
    CAPTURE(bad);
    CHECK_FALSE(PciAddress::parse(bad).has_value());
  }
  CHECK(*PciAddress::parse("0000:41:00.0") < *PciAddress::parse("0000:41:00.1"));
  CHECK(PciAddress::parse("0000:41:00.0")->same_slot(*PciAddress::parse("0000:41:00.3")));
}
