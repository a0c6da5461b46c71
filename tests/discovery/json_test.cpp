#include "gpunode/discovery/json.hpp"

#include <doctest/doctest.h>

#include <boost/json/serialize.hpp>

#include "gpunode/discovery/rules.hpp"

using namespace gpunode::discovery;

TEST_CASE("unit JSON has the contract's keys, in its order, with its types") {
  Unit u;
  u.id = "u-0000-41-00-0";
  u.iommu_group = 37;
  u.cls = UnitClass::vfio_group;
  u.numa_nodes = {0};
  u.sellable = u.reservable = true;
  DeviceRecord d;
  d.address = *PciAddress::parse("0000:41:00.0");
  d.vendor_id = 0x10de;
  d.device_id = 0x2330;
  d.class_code = 0x030200;
  d.driver = "vfio-pci";
  d.numa_node = 0;
  d.name = "GH100 [H100 SXM5 80GB]";
  u.devices.push_back({d, Role::gpu});
  CHECK(
      boost::json::serialize(unit_to_json(u, {"rsv_1"})) ==
      R"({"id":"u-0000-41-00-0","iommuGroup":37,"class":"vfio-group","gpuCount":1,"numaNodes":[0],)"
      R"("sellable":true,"reservable":true,"notReservableReasons":[],)"
      R"("gpus":[{"pciAddress":"0000:41:00.0","vendorId":"10de","deviceId":"2330","name":"GH100 [H100 SXM5 80GB]",)"
      R"("driver":"vfio-pci","numaNode":0}],)"
      R"("devices":[{"pciAddress":"0000:41:00.0","vendorId":"10de","deviceId":"2330","classCode":"0302",)"
      R"("role":"gpu","driver":"vfio-pci"}],"reservationIds":["rsv_1"],"health":{"state":"ok","reasons":[]}})");
  u.iommu_group.reset();
  u.devices[0].device.driver.reset();
  u.devices[0].device.numa_node.reset();
  u.reasons.push_back({"driver-unbound", "gpu 0000:41:00.0 has no driver"});
  auto o = unit_to_json(u);
  CHECK(o.at("iommuGroup").is_null());
  CHECK(o.at("gpus").as_array().at(0).as_object().at("driver").is_null());
  CHECK(o.at("gpus").as_array().at(0).as_object().at("numaNode").is_null());
  CHECK(o.at("notReservableReasons").as_array().at(0).as_object().at("code") == "driver-unbound");
  CHECK(boost::json::serialize(units_body("node-1", {})) == R"({"nodeId":"node-1","units":[]})");
}

TEST_CASE("a unit's health (CONTRACT §13): its failing codes join the reasons; warnings do not") {
  Unit u;
  u.id = "u-0000-41-00-0";
  u.reasons.push_back({"class-not-reservable", "class none is not in discovery.reservable_classes"});
  u.sellable = true;
  apply_health(
      u, UnitHealth{
             {{"link-degraded", "0000:40:01.1", "link x4, widest seen x16", "2027-01-31T00:00:00Z", true},
              {"aer-not-monitored", "0000:41:00.0", "no aer_dev_* files", "2027-01-31T00:00:00Z", false},
              {"link-degraded", "0000:41:00.0", "link x8, widest seen x16", "2027-01-31T00:01:00Z", true}}});
  CHECK_FALSE(u.sellable);
  CHECK_FALSE(u.reservable);
  REQUIRE(u.reasons.size() == 2);
  CHECK(u.reasons[1].code == "link-degraded");
  CHECK(u.reasons[1].message ==
        "0000:40:01.1: link x4, widest seen x16; 0000:41:00.0: link x8, widest seen x16");
  CHECK(boost::json::serialize(health_to_json(u.health)) ==
        R"({"state":"failing","reasons":[{"code":"link-degraded","pciAddress":"0000:40:01.1",)"
        R"("detail":"link x4, widest seen x16","since":"2027-01-31T00:00:00Z"},{"code":"aer-not-monitored",)"
        R"("pciAddress":"0000:41:00.0","detail":"no aer_dev_* files","since":"2027-01-31T00:00:00Z"},)"
        R"({"code":"link-degraded","pciAddress":"0000:41:00.0","detail":"link x8, widest seen x16",)"
        R"("since":"2027-01-31T00:01:00Z"}]})");
  // Applied again (a poll that found the unit healthy): the health codes go, the rest stays.
  apply_health(u, UnitHealth{{{"aer-not-monitored", "0000:41:00.0", "no aer_dev_* files",
                               "2027-01-31T00:00:00Z", false}}});
  REQUIRE(u.reasons.size() == 1);
  CHECK(u.reasons[0].code == "class-not-reservable");
  CHECK(u.sellable);
  CHECK_FALSE(u.reservable);
  CHECK(u.health.state() == HealthState::warning);
}
