// Fuzz target: the libvirt domain XML parsers (gpunode::vmctl::parse_domain_xml and the three
// single-purpose parsers beside it), over XML text as libvirt (or a hook's stdin) hands it over.
//
// Properties: no parser throws or crashes; parse_domain_xml (SAX events) gives what the tree
// readers give (detail::parse_domain_xml_tree), and what the three separate parsers give;
// PCI addresses are sorted, unique and "dddd:bb:ss.f" in lower-case hex; every string taken from
// the text is valid UTF-8 (it goes into JSON answers); a termination record read back from the
// element termination_xml() and termination_element() write is the same record.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "gpunode/store/canonical_json.hpp"
#include "gpunode/vmctl/vmctl.hpp"

namespace {

using gpunode::fuzz::check;
namespace vmctl = gpunode::vmctl;

bool is_pci_address(std::string_view a) {
  if (a.size() != 12 || a[4] != ':' || a[7] != ':' || a[10] != '.') return false;
  for (std::size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11}) {
    const char c = a[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return a[11] <= '7' && (a[8] == '0' || a[8] == '1');
}

void check_utf8(std::string_view text, std::string_view what) {
  check(gpunode::store::is_valid_utf8(text), what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view xml(reinterpret_cast<const char*>(data), size);
  const vmctl::DomainXmlFacts facts = vmctl::parse_domain_xml(xml);

  // The SAX reading against the tree's, fact by fact.
  const vmctl::DomainXmlFacts tree = vmctl::detail::parse_domain_xml_tree(xml);
  check(facts.is_domain == tree.is_domain, "parse_domain_xml and the tree differ on is_domain");
  check(facts.name == tree.name, "parse_domain_xml and the tree differ on the name", facts.name);
  check(facts.uuid == tree.uuid, "parse_domain_xml and the tree differ on the uuid", facts.uuid);
  check(facts.unreadable_pci_hostdevs == tree.unreadable_pci_hostdevs,
        "parse_domain_xml and the tree differ on unreadable hostdevs");
  check(facts.pci_addresses == tree.pci_addresses, "parse_domain_xml and the tree differ on the addresses");
  check(facts.label == tree.label, "parse_domain_xml and the tree differ on the label");
  check(facts.termination == tree.termination, "parse_domain_xml and the tree differ on the termination");
  check(facts.pci_addresses == vmctl::hostdev_pci_addresses(xml),
        "parse_domain_xml and hostdev_pci_addresses differ");
  check(facts.label == vmctl::parse_workload(xml), "parse_domain_xml and parse_workload differ");
  check(facts.termination == vmctl::parse_termination(xml), "parse_domain_xml and parse_termination differ");
  for (std::size_t i = 0; i < facts.pci_addresses.size(); ++i) {
    check(is_pci_address(facts.pci_addresses[i]), "not a PCI address", facts.pci_addresses[i]);
    if (i > 0)
      check(facts.pci_addresses[i - 1] < facts.pci_addresses[i], "PCI addresses not sorted and unique");
  }
  if (!facts.is_domain) check(facts.name.empty() && facts.uuid.empty(), "a name or uuid outside a <domain>");
  check_utf8(facts.name, "the domain's name is not valid UTF-8");
  check_utf8(facts.uuid, "the domain's uuid is not valid UTF-8");
  if (facts.label) {
    check(!facts.label->vm_id.empty() && !facts.label->org.empty(),
          "a workload label with an empty vm-id or org");
    check_utf8(facts.label->vm_id, "vm-id is not valid UTF-8");
    check_utf8(facts.label->org, "org is not valid UTF-8");
  }
  if (facts.termination) {
    const vmctl::TerminationRecord& r = *facts.termination;
    for (const std::string* s : {&r.reason, &r.at, &r.by, &r.audit_id})
      check_utf8(*s, "a termination attribute is not valid UTF-8");
    const std::string element = vmctl::termination_xml(r);
    check(vmctl::parse_termination(element) == r, "termination_xml does not read back as the same record",
          element);
    const std::string bare = vmctl::termination_element(r);
    check(vmctl::parse_termination(bare) == r, "termination_element does not read back as the same record",
          bare);
  }
  return 0;
}
