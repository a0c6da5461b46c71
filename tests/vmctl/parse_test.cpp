// Pure parsers of domain XML and §5 metadata, by tables of text.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "gpunode/vmctl/vmctl.hpp"

using namespace gpunode::vmctl;

namespace {

std::string domain_with(const std::string& devices) {
  return "<domain type='kvm'><name>d</name><devices>" + devices + "</devices></domain>";
}
std::string pci(const std::string& address_attrs) {
  return "<hostdev mode='subsystem' type='pci' managed='yes'><source><address " + address_attrs +
         "/></source></hostdev>";
}

}  // namespace

TEST_CASE("hostdev_pci_addresses: the pci hostdev sources, normalised") {
  struct Case {
    const char* name;
    std::string xml;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases{
      {"one, hex", domain_with(pci("domain='0x0000' bus='0x41' slot='0x00' function='0x0'")), {"0000:41:00.0"}},
      {"several, sorted and deduplicated",
       domain_with(pci("domain='0x0000' bus='0xa4' slot='0x00' function='0x0'") +
                   pci("domain='0x0000' bus='0xa3' slot='0x00' function='0x0'") +
                   pci("domain='0x0000' bus='0xa3' slot='0x00' function='0x0'")),
       {"0000:a3:00.0", "0000:a4:00.0"}},
      {"decimal", domain_with(pci("domain='0' bus='65' slot='31' function='7'")), {"0000:41:1f.7"}},
      {"octal, as libvirt reads a leading 0", domain_with(pci("domain='0' bus='010' slot='0' function='0'")),
       {"0000:08:00.0"}},
      {"upper-case hex and a high domain", domain_with(pci("domain='0X10' bus='0XC1' slot='0x1' function='0x3'")),
       {"0010:c1:01.3"}},
      {"missing domain defaults to 0", domain_with(pci("bus='0x43' slot='0x00' function='0x0'")), {"0000:43:00.0"}},
      {"missing bus skipped", domain_with(pci("domain='0' slot='0' function='0'")), {}},
      {"missing function skipped", domain_with(pci("domain='0' bus='0x41' slot='0'")), {}},
      {"out of range slot skipped", domain_with(pci("domain='0' bus='0x41' slot='0x20' function='0'")), {}},
      {"out of range bus skipped", domain_with(pci("domain='0' bus='256' slot='0' function='0'")), {}},
      {"not a number skipped", domain_with(pci("domain='0' bus='0xzz' slot='0' function='0'")), {}},
      {"negative skipped", domain_with(pci("domain='0' bus='-1' slot='0' function='0'")), {}},
      {"usb hostdev ignored",
       domain_with("<hostdev mode='subsystem' type='usb'><source><vendor id='0x0781'/><product id='0x5567'/>"
                   "<address bus='1' device='2'/></source></hostdev>" +
                   pci("domain='0x0000' bus='0x43' slot='0x00' function='0x0'")),
       {"0000:43:00.0"}},
      {"mdev hostdev ignored",
       domain_with("<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address "
                   "uuid='c2177883-f1bb-47f0-914d-32a22e3a8804'/></source></hostdev>"),
       {}},
      {"guest-side address of a pci hostdev is not its source",
       domain_with("<hostdev mode='subsystem' type='pci'><source><address domain='0' bus='0x41' slot='0' "
                   "function='0'/></source><address type='pci' domain='0' bus='0x05' slot='0' function='0'/>"
                   "</hostdev>"),
       {"0000:41:00.0"}},
      {"no devices", "<domain type='kvm'><name>x</name></domain>", {}},
      {"not a domain", "<node>" + pci("domain='0' bus='0x41' slot='0' function='0'") + "</node>", {}},
      {"garbage", "<<<not xml", {}},
      {"truncated", domain_with(pci("domain='0' bus='0x41' slot='0' function='0'")).substr(0, 60), {}},
      {"empty", "", {}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    CHECK(hostdev_pci_addresses(c.xml) == c.want);
  }
}

TEST_CASE("parse_workload: valid §5 metadata only") {
  struct Case {
    const char* name;
    std::string xml;
    std::optional<WorkloadLabel> want;
  };
  const WorkloadLabel b_spot{"vm-123", "org-b", Tier::spot};
  const std::vector<Case> cases{
      {"the §5 element", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" org="org-b" tier="spot"/>)",
       b_spot},
      {"another prefix", R"(<gw:workload xmlns:gw="urn:gpunode:workload:1" vm-id="vm-123" org="org-b" tier="spot"/>)",
       b_spot},
      {"as virDomainGetMetadata returns it (namespace stripped)",
       R"(<workload vm-id="vm-123" org="org-b" tier="spot"/>)", b_spot},
      {"on-demand", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="on-demand"/>)",
       WorkloadLabel{"v", "o", Tier::on_demand}},
      {"reserved", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="reserved"/>)",
       WorkloadLabel{"v", "o", Tier::reserved}},
      {"extra attributes ignored",
       R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" org="org-b" tier="spot" flavor="x" note=""/>)",
       b_spot},
      {"inside <metadata>",
       R"(<metadata><other xmlns="urn:x"/><p:workload xmlns:p="urn:gpunode:workload:1" vm-id="vm-123" org="org-b" tier="spot"/></metadata>)",
       b_spot},
      {"inside a domain",
       R"(<domain type='kvm'><name>d</name><metadata><w:workload xmlns:w="urn:gpunode:workload:1" vm-id="vm-123" org="org-b" tier="spot"/></metadata></domain>)",
       b_spot},
      {"missing vm-id", R"(<workload xmlns="urn:gpunode:workload:1" org="org-b" tier="spot"/>)", std::nullopt},
      {"empty vm-id", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="" org="org-b" tier="spot"/>)", std::nullopt},
      {"missing org", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" tier="spot"/>)", std::nullopt},
      {"empty org", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" org="" tier="spot"/>)", std::nullopt},
      {"missing tier", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" org="org-b"/>)", std::nullopt},
      {"unknown tier", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" org="org-b" tier="gold"/>)",
       std::nullopt},
      {"tier in another case", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="Spot"/>)",
       std::nullopt},
      {"tier spelled with underscore", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="on_demand"/>)",
       std::nullopt},
      {"another namespace", R"(<workload xmlns="urn:gpunode:workload:2" vm-id="v" org="o" tier="spot"/>)",
       std::nullopt},
      {"unnamespaced inside <metadata> is not ours",
       R"(<metadata><workload vm-id="v" org="o" tier="spot"/></metadata>)", std::nullopt},
      {"domain without metadata", "<domain type='kvm'><name>d</name></domain>", std::nullopt},
      {"another element", R"(<termination xmlns="urn:gpunode:termination:1" reason="r"/>)", std::nullopt},
      {"garbage", "vm-id=\"v\" org=\"o\" tier=\"spot\"", std::nullopt},
      {"unclosed", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="spot">)", std::nullopt},
      {"empty", "", std::nullopt},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    CHECK(parse_workload(c.xml) == c.want);
  }
}

TEST_CASE("termination element: written, then read back") {
  const TerminationRecord record{"capacity-reclaim", "2027-01-31T00:00:00Z", "org-a&\"b'<c>", "aud_42"};
  const std::string xml = termination_xml(record);
  CHECK(xml.starts_with(R"(<termination xmlns="urn:gpunode:termination:1" reason="capacity-reclaim")"));
  CHECK(parse_termination(xml) == record);
  const std::string element = termination_element(record);
  CHECK(element.find("xmlns") == std::string::npos);
  CHECK(parse_termination(element) == record);

  CHECK(parse_termination(R"(<metadata><t:termination xmlns:t="urn:gpunode:termination:1" reason="capacity-reclaim" at="T" by="org-a" audit-id="aud_1"/></metadata>)") ==
        TerminationRecord{"capacity-reclaim", "T", "org-a", "aud_1"});
  CHECK(parse_termination(R"(<termination xmlns="urn:gpunode:termination:1" reason="capacity-reclaim"/>)") ==
        TerminationRecord{"capacity-reclaim", "", "", ""});
  CHECK_FALSE(parse_termination(R"(<termination xmlns="urn:other" reason="r"/>)").has_value());
  CHECK_FALSE(parse_termination(R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="spot"/>)").has_value());
  CHECK_FALSE(parse_termination("<termination").has_value());
  CHECK_FALSE(parse_termination("").has_value());
}

TEST_CASE("vocabularies") {
  CHECK(state_name(0) == "nostate");
  CHECK(state_name(1) == "running");
  CHECK(state_name(4) == "shutdown");
  CHECK(state_name(5) == "shutoff");
  CHECK(state_name(7) == "pmsuspended");
  CHECK(state_name(8) == "nostate");
  CHECK(state_name(-1) == "nostate");
  for (const char* s : {"running", "blocked", "paused", "shutdown", "pmsuspended"}) CHECK(state_active(s));
  for (const char* s : {"shutoff", "crashed", "nostate", ""}) CHECK_FALSE(state_active(s));
  CHECK(to_string(Tier::on_demand) == "on-demand");
  CHECK(parse_tier("reserved") == Tier::reserved);
  CHECK_FALSE(parse_tier("").has_value());
}

TEST_CASE("parse_domain_xml: one parse gives what the three parsers give") {
  const std::vector<std::string> docs{
      R"(<domain><metadata><w:workload xmlns:w="urn:gpunode:workload:1" vm-id="vm-1" org="o" tier="spot"/>)"
      R"(<t:termination xmlns:t="urn:gpunode:termination:1" reason="capacity-reclaim" at="a" by="b" audit-id="aud_1"/></metadata>)"
      R"(<devices><hostdev type='pci'><source><address domain='0x0000' bus='0x41' slot='0' function='0'/></source></hostdev>)"
      R"(<hostdev type='pci'><source><address bus='65' slot='0' function='1'/></source></hostdev></devices></domain>)",
      R"(<domain><devices/></domain>)",
      R"(<domain><metadata><workload xmlns="urn:gpunode:workload:1" vm-id="" org="o" tier="spot"/></metadata></domain>)",
      "not xml at all",
      "",
  };
  for (const auto& d : docs) {
    CAPTURE(d);
    const auto facts = parse_domain_xml(d);
    CHECK(facts.pci_addresses == hostdev_pci_addresses(d));
    CHECK(facts.label == parse_workload(d));
    CHECK(facts.termination == parse_termination(d));
  }
  CHECK(parse_domain_xml(docs[0]).pci_addresses == std::vector<std::string>{"0000:41:00.0", "0000:41:00.1"});
}

TEST_CASE("parse_domain_xml: name, uuid, and PCI hostdevs whose address cannot be read (the hook's admission)") {
  const auto facts = parse_domain_xml(
      "<domain type='kvm'><name>train-7</name><uuid>0b1e0f7c-5a52-4ad0-9a6a-9f3f0e2b7d11</uuid><devices>"
      "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/></source></hostdev>"
      "<hostdev mode='subsystem' type='pci'><source><address bus='0x999' slot='0' function='0'/></source></hostdev>"
      "<hostdev mode='subsystem' type='pci'><source/></hostdev>"
      "<hostdev mode='subsystem' type='usb'><source><vendor id='0x1'/></source></hostdev>"
      "</devices></domain>");
  CHECK(facts.is_domain);
  CHECK(facts.name == "train-7");
  CHECK(facts.uuid == "0b1e0f7c-5a52-4ad0-9a6a-9f3f0e2b7d11");
  CHECK(facts.pci_addresses == std::vector<std::string>{"0000:41:00.0"});
  CHECK(facts.unreadable_pci_hostdevs == 2);
  CHECK_FALSE(parse_domain_xml("<network><name>default</name></network>").is_domain);
  CHECK_FALSE(parse_domain_xml("<domain xmlns='urn:other'><name>x</name></domain>").is_domain);
  CHECK_FALSE(parse_domain_xml("<domain><name>x</name>").is_domain);  // not well formed
  const auto bare = parse_domain_xml("<domain/>");
  CHECK(bare.is_domain);
  CHECK(bare.name.empty());
  CHECK(bare.unreadable_pci_hostdevs == 0);
}
