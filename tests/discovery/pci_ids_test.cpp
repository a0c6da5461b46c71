#include "gpunode/discovery/pci_ids.hpp"

#include <doctest/doctest.h>

#include <cerrno>

using gpunode::discovery::PciIds;

TEST_CASE("pci.ids text: only the wanted vendors, devices not subsystems") {
  const char* text =
      "# comment\n"
      "#\t2330  commented out\n"
      "1000  Broadcom / LSI\n"
      "\tc030  PEX89000 switch\n"
      "10de  NVIDIA Corporation\n"
      "\t2330  GH100 [H100 SXM5 80GB]\n"
      "\t\t10de 16c1  H100 SXM5 80GB\n"
      "\t22a3  GH100 [H100 NVSwitch]  \r\n"
      "\tzzzz  broken line\n"
      "\t1e04\n"
      "1002  Advanced Micro Devices, Inc. [AMD/ATI]\n"
      "\t74a1  Aqua Vanjaram [Instinct MI300X]\n"
      "C 03  Display controller\n"
      "\t02  3D controller\n";
  PciIds ids = PciIds::parse(text, {0x10de, 0x1002});
  CHECK(ids.device_name(0x10de, 0x2330) == "GH100 [H100 SXM5 80GB]");
  CHECK(ids.device_name(0x10de, 0x22a3) == "GH100 [H100 NVSwitch]");
  CHECK(ids.device_name(0x1002, 0x74a1) == "Aqua Vanjaram [Instinct MI300X]");
  CHECK_FALSE(ids.device_name(0x1000, 0xc030));  // not a wanted vendor
  CHECK_FALSE(ids.device_name(0x10de, 0x16c1));  // a subsystem line
  CHECK_FALSE(ids.device_name(0x10de, 0x1e04));  // no name
  CHECK(ids.size() == 3);
}

TEST_CASE("pci.ids text out of order: every device found; a device given twice keeps its first name") {
  const char* text =
      "10de  NVIDIA Corporation\n"
      "\t2330  GH100 [H100 SXM5 80GB]\n"
      "\t1e04  TU102\n"
      "\t2330  a second name for 2330\n"
      "1002  AMD\n"
      "\t74a1  MI300X\n"
      "10de  NVIDIA again\n"
      "\t0001  first of all\n"
      "\t2330  a third name\n"
      "\tffff  last of all\n";
  PciIds ids = PciIds::parse(text, {0x10de, 0x1002});
  CHECK(ids.size() == 5);
  CHECK(ids.device_name(0x10de, 0x2330) == "GH100 [H100 SXM5 80GB]");
  CHECK(ids.device_name(0x10de, 0x1e04) == "TU102");
  CHECK(ids.device_name(0x10de, 0x0001) == "first of all");
  CHECK(ids.device_name(0x10de, 0xffff) == "last of all");
  CHECK(ids.device_name(0x1002, 0x74a1) == "MI300X");
  CHECK_FALSE(ids.device_name(0x10de, 0x0000));
  CHECK_FALSE(ids.device_name(0x1002, 0x2330));  // the same device id under another vendor
  CHECK_FALSE(ids.device_name(0xffff, 0xffff));
}

TEST_CASE("garbage and truncated text never throws") {
  PciIds ids = PciIds::parse(std::string_view("10de\n\t\n\t2\n\x01\x02\xff", 12), {0x10de});
  CHECK(ids.size() == 0);
  CHECK(PciIds::parse("", {0x10de}).size() == 0);
}

TEST_CASE("loading Debian's pci.ids") {
  auto missing = PciIds::load("/nonexistent/pci.ids", {0x10de});
  REQUIRE_FALSE(missing);
  CHECK(missing.error().detail == "cannot read /nonexistent/pci.ids: No such file or directory");
  CHECK(missing.error().code == gpunode::error::Errc::not_found);
  CHECK(missing.error().native == ENOENT);
  auto directory = PciIds::load("/", {0x10de});
  REQUIRE_FALSE(directory);
  CHECK(directory.error().detail == "cannot read /: not a regular file");
  CHECK(directory.error().code == gpunode::error::Errc::invalid);
  auto ids = PciIds::load(GPUNODE_PCI_IDS, {0x10de, 0x1002});
  REQUIRE(ids);
  CHECK(ids->size() > 500);
  CHECK(ids->device_name(0x10de, 0x1e04).value_or("").find("TU102") != std::string::npos);
}
