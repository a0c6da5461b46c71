#include "gpunode/discovery/json.hpp"

#include <doctest/doctest.h>

#include <boost/json/serialize.hpp>

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
      R"("role":"gpu","driver":"vfio-pci"}],"reservationIds":["rsv_1"]})");
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
