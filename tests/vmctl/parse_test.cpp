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
      {"one, hex",
       domain_with(pci("domain='0x0000' bus='0x41' slot='0x00' function='0x0'")),
       {"0000:41:00.0"}},
      {"several, sorted and deduplicated",
       domain_with(pci("domain='0x0000' bus='0xa4' slot='0x00' function='0x0'") +
                   pci("domain='0x0000' bus='0xa3' slot='0x00' function='0x0'") +
                   pci("domain='0x0000' bus='0xa3' slot='0x00' function='0x0'")),
       {"0000:a3:00.0", "0000:a4:00.0"}},
      {"decimal", domain_with(pci("domain='0' bus='65' slot='31' function='7'")), {"0000:41:1f.7"}},
      {"octal, as libvirt reads a leading 0",
       domain_with(pci("domain='0' bus='010' slot='0' function='0'")),
       {"0000:08:00.0"}},
      {"upper-case hex and a high domain",
       domain_with(pci("domain='0X10' bus='0XC1' slot='0x1' function='0x3'")),
       {"0010:c1:01.3"}},
      {"missing domain defaults to 0",
       domain_with(pci("bus='0x43' slot='0x00' function='0x0'")),
       {"0000:43:00.0"}},
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
      {"the §5 element",
       R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" org="org-b" tier="spot"/>)", b_spot},
      {"another prefix",
       R"(<gw:workload xmlns:gw="urn:gpunode:workload:1" vm-id="vm-123" org="org-b" tier="spot"/>)", b_spot},
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
      {"missing vm-id", R"(<workload xmlns="urn:gpunode:workload:1" org="org-b" tier="spot"/>)",
       std::nullopt},
      {"empty vm-id", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="" org="org-b" tier="spot"/>)",
       std::nullopt},
      {"missing org", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" tier="spot"/>)",
       std::nullopt},
      {"empty org", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" org="" tier="spot"/>)",
       std::nullopt},
      {"missing tier", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" org="org-b"/>)",
       std::nullopt},
      {"unknown tier", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="vm-123" org="org-b" tier="gold"/>)",
       std::nullopt},
      {"tier in another case", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="Spot"/>)",
       std::nullopt},
      {"tier spelled with underscore",
       R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="on_demand"/>)", std::nullopt},
      {"another namespace", R"(<workload xmlns="urn:gpunode:workload:2" vm-id="v" org="o" tier="spot"/>)",
       std::nullopt},
      {"unnamespaced inside <metadata> is not ours",
       R"(<metadata><workload vm-id="v" org="o" tier="spot"/></metadata>)", std::nullopt},
      {"domain without metadata", "<domain type='kvm'><name>d</name></domain>", std::nullopt},
      {"another element", R"(<termination xmlns="urn:gpunode:termination:1" reason="r"/>)", std::nullopt},
      {"garbage", "vm-id=\"v\" org=\"o\" tier=\"spot\"", std::nullopt},
      {"unclosed", R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="spot">)",
       std::nullopt},
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

  CHECK(
      parse_termination(
          R"(<metadata><t:termination xmlns:t="urn:gpunode:termination:1" reason="capacity-reclaim" at="T" by="org-a" audit-id="aud_1"/></metadata>)") ==
      TerminationRecord{"capacity-reclaim", "T", "org-a", "aud_1"});
  CHECK(parse_termination(R"(<termination xmlns="urn:gpunode:termination:1" reason="capacity-reclaim"/>)") ==
        TerminationRecord{"capacity-reclaim", "", "", ""});
  CHECK_FALSE(parse_termination(R"(<termination xmlns="urn:other" reason="r"/>)").has_value());
  CHECK_FALSE(parse_termination(R"(<workload xmlns="urn:gpunode:workload:1" vm-id="v" org="o" tier="spot"/>)")
                  .has_value());
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

TEST_CASE(
    "parse_domain_xml: name, uuid, and PCI hostdevs whose address cannot be read (the hook's admission)") {
  const auto facts = parse_domain_xml(
      "<domain type='kvm'><name>train-7</name><uuid>0b1e0f7c-5a52-4ad0-9a6a-9f3f0e2b7d11</uuid><devices>"
      "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x41' "
      "slot='0x00' function='0x0'/></source></hostdev>"
      "<hostdev mode='subsystem' type='pci'><source><address bus='0x999' slot='0' "
      "function='0'/></source></hostdev>"
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

namespace {

bool same(const DomainXmlFacts& a, const DomainXmlFacts& b) {
  return a.pci_addresses == b.pci_addresses && a.label == b.label && a.termination == b.termination &&
         a.is_domain == b.is_domain && a.name == b.name && a.uuid == b.uuid &&
         a.unreadable_pci_hostdevs == b.unreadable_pci_hostdevs;
}

}  // namespace

TEST_CASE("parse_domain_xml reads SAX events and answers as the tree readers do, on the corners of XML") {
  const std::string w = R"(vm-id="vm-1" org="org-b" tier="spot")";
  const std::string t = R"(reason="capacity-reclaim" at="2027-01-31T00:00:00Z" by="org-a" audit-id="aud_1")";
  const std::vector<std::string> docs{
      // what libvirt hands over
      "<domain type='kvm' id='3'>\n  <name>train-7</name>\n  "
      "<uuid>0b1e0f7c-5a52-4ad0-9a6a-9f3f0e2b7d11</uuid>\n"
      "  <metadata>\n    <gw:workload xmlns:gw=\"urn:gpunode:workload:1\" " +
          w +
          "/>\n"
          "    <gt:termination xmlns:gt=\"urn:gpunode:termination:1\" " +
          t +
          "/>\n  </metadata>\n"
          "  <devices>\n" +
          pci("domain='0x0000' bus='0x41' slot='0x00' function='0x0'") + "\n" +
          pci("domain='0x0000' bus='0x41' slot='0x00' function='0x1'") + "\n  </devices>\n</domain>\n",
      // names with a prefix bound to no namespace (the tree names them "p:local")
      "<p:domain><name>x</name></p:domain>",
      "<domain><p:name>x</p:name><p:devices>" + pci("bus='1' slot='0' function='0'") +
          "</p:devices></domain>",
      "<domain><devices><hostdev p:type='pci'><source><address bus='1' slot='0' "
      "function='0'/></source></hostdev></devices></domain>",
      "<domain><devices><hostdev type='pci'><source><address p:bus='1' slot='0' "
      "function='0'/></source></hostdev></devices></domain>",
      // names in a namespace: a <domain> in one still has its devices read, not its name or metadata
      "<d:domain xmlns:d='urn:x'><name>x</name><devices>" + pci("bus='2' slot='0' function='0'") +
          "</devices>"
          "<metadata><workload xmlns='urn:gpunode:workload:1' " +
          w + "/></metadata></d:domain>",
      "<domain><x:name xmlns:x='urn:x'>n</x:name><x:devices xmlns:x='urn:x'>" +
          pci("bus='3' slot='0' function='0'") +
          "</x:devices><x:metadata xmlns:x='urn:x'><workload xmlns='urn:gpunode:workload:1' " + w +
          "/></x:metadata></domain>",
      // the first of each only
      "<domain><name>a</name><name>b</name><uuid>u1</uuid><uuid>u2</uuid><devices/><devices>" +
          pci("bus='4' slot='0' function='0'") + "</devices></domain>",
      "<domain><metadata/><metadata><workload xmlns='urn:gpunode:workload:1' " + w + "/></metadata></domain>",
      "<domain><metadata><workload xmlns='urn:gpunode:workload:1' vm-id='' org='o' tier='spot'/>"
      "<workload xmlns='urn:gpunode:workload:1' " +
          w + "/></metadata></domain>",
      "<domain><devices><hostdev type='pci'><source/><source><address bus='5' slot='0' "
      "function='0'/></source></hostdev>"
      "<hostdev type='pci'><source><address bus='zz' slot='0' function='0'/><address bus='6' slot='0' "
      "function='0'/></source></hostdev>"
      "<hostdev type='pci'><source><x><address bus='7' slot='0' function='0'/></x></source></hostdev>"
      "<hostdev type='pci'/><hostdev type='usb'><source><address bus='8' slot='0' "
      "function='0'/></source></hostdev>"
      "<hostdev><source><address bus='9' slot='0' function='0'/></source></hostdev></devices></domain>",
      "<domain><x><devices>" + pci("bus='10' slot='0' function='0'") + "</devices></x></domain>",
      // text: nested, CDATA, character and predefined entity references, comments, blanks
      "<domain><name>a<b>c</b><![CDATA[<d>]]>&#x41;&lt;&amp;<!-- no -->e</name><uuid> u </uuid></domain>",
      // attribute values: references, '&' (SAX keeps "&#38;" for the tree to decode), blanks normalised
      "<domain><metadata><workload xmlns='urn:gpunode:workload:1' vm-id='vm&amp;1' org='o&#38;b' "
      "tier='spot'/></metadata></domain>",
      "<domain><metadata><workload xmlns='urn:gpunode:workload:1' vm-id='vm&lt;1&gt;' org='&#x6f;rg' "
      "tier='&#115;pot'/></metadata></domain>",
      "<domain><metadata><workload xmlns='urn:gpunode:workload:1' vm-id='a\tb\nc' org='o' "
      "tier='spot'/></metadata></domain>",
      "<domain><devices><hostdev type='&#112;ci'><source><address bus='0x&#52;1' slot='0' "
      "function='0'/></source></hostdev></devices></domain>",
      // a DTD, its entities and defaulted attributes: left to the tree readers
      "<!DOCTYPE domain [<!ENTITY b '0x41'><!ATTLIST hostdev type CDATA "
      "'pci'>]><domain><name>&b;</name><devices>"
      "<hostdev><source><address bus='&b;' slot='0' function='0'/></source></hostdev></devices></domain>",
      // roots other than <domain>
      "<metadata><workload xmlns='urn:gpunode:workload:1' " + w +
          "/><termination xmlns='urn:gpunode:termination:1' " + t + "/></metadata>",
      "<m:metadata xmlns:m='urn:x'><workload xmlns='urn:gpunode:workload:1' " + w + "/></m:metadata>",
      "<workload " + w + "/>",
      "<workload xmlns='urn:gpunode:termination:1' " + w + "/>",
      "<termination xmlns='urn:gpunode:termination:1' " + t + "><workload xmlns='urn:gpunode:workload:1' " +
          w + "/></termination>",
      "<network><name>default</name><devices>" + pci("bus='1' slot='0' function='0'") +
          "</devices></network>",
      // not well formed, or barely XML
      "<domain><name>x</name>",
      "<domain><a:b/></domain>",
      "<domain a='1' a='2'/>",
      "<?xml version='1.0' encoding='UTF-8'?><domain/>",
      "\xEF\xBB\xBF<domain><name>bom</name></domain>",
      "<domain>",
      "",
      " ",
  };
  for (const auto& d : docs) {
    CAPTURE(d);
    const auto fast = parse_domain_xml(d);
    const auto tree = detail::parse_domain_xml_tree(d);
    CHECK(same(fast, tree));
    CHECK(fast.pci_addresses == hostdev_pci_addresses(d));
    CHECK(fast.label == parse_workload(d));
    CHECK(fast.termination == parse_termination(d));
  }
  // The values themselves, where the corners matter.
  CHECK(parse_domain_xml(docs[0]).name == "train-7");
  CHECK(parse_domain_xml(docs[0]).pci_addresses == std::vector<std::string>{"0000:41:00.0", "0000:41:00.1"});
  CHECK(parse_domain_xml(docs[12]).name == "ac<d>A<&e");
  CHECK(parse_domain_xml(docs[13]).label == WorkloadLabel{"vm&1", "o&b", Tier::spot});
  CHECK(parse_domain_xml(docs[16]).pci_addresses == std::vector<std::string>{"0000:41:00.0"});
  CHECK(parse_domain_xml(docs[17]).name == "0x41");
}
