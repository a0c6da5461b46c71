// Pure parsers of domain XML and metadata elements (CONTRACT §5), over libxml2.
#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdio>
#include <memory>
#include <mutex>

#include <libxml/parser.h>
#include <libxml/tree.h>

#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::vmctl {
namespace {

// libxml2 speaks unsigned char; BAD_CAST is a C cast, so these replace it.
const xmlChar* x(const char* text) { return reinterpret_cast<const xmlChar*>(text); }
std::string_view sv(const xmlChar* text) {
  return text == nullptr ? std::string_view{} : std::string_view{reinterpret_cast<const char*>(text)};
}

struct DocFree {
  void operator()(xmlDoc* doc) const { xmlFreeDoc(doc); }
};
using Doc = std::unique_ptr<xmlDoc, DocFree>;

void init_libxml() {
  static std::once_flag once;
  std::call_once(once, [] { xmlInitParser(); });
}

// Parses untrusted text: no network, no entity substitution, no DTD loading, no error printing.
Doc parse(std::string_view text) {
  init_libxml();
  if (text.empty() || text.size() > static_cast<std::size_t>(INT_MAX)) return nullptr;
  constexpr int options = XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING | XML_PARSE_NOCDATA;
  return Doc{xmlReadMemory(text.data(), static_cast<int>(text.size()), "noname.xml", nullptr, options)};
}

bool is_element(const xmlNode* node, std::string_view name) {
  return node != nullptr && node->type == XML_ELEMENT_NODE && sv(node->name) == name;
}
std::string_view ns_of(const xmlNode* node) { return node->ns == nullptr ? std::string_view{} : sv(node->ns->href); }

const xmlNode* first_child(const xmlNode* parent, std::string_view name) {
  for (const xmlNode* c = parent->children; c != nullptr; c = c->next)
    if (is_element(c, name)) return c;
  return nullptr;
}

// An attribute's value (no namespace); nullopt when absent.
std::optional<std::string> attr(const xmlNode* node, const char* name) {
  xmlChar* value = xmlGetNoNsProp(node, x(name));
  if (value == nullptr) return std::nullopt;
  std::string out{sv(value)};
  xmlFree(value);
  return out;
}

// The element `name` in namespace `ns`: the root itself (in `ns` or, as virDomainGetMetadata
// returns it, in no namespace), or a child of <metadata> (root, or <domain>'s child).
const xmlNode* find_metadata_element(const xmlDoc* doc, std::string_view name, std::string_view ns) {
  const xmlNode* root = xmlDocGetRootElement(doc);
  if (root == nullptr) return nullptr;
  if (is_element(root, name) && (root->ns == nullptr || ns_of(root) == ns)) return root;
  const xmlNode* metadata = nullptr;
  if (is_element(root, "metadata") && root->ns == nullptr) metadata = root;
  else if (is_element(root, "domain") && root->ns == nullptr) metadata = first_child(root, "metadata");
  if (metadata == nullptr) return nullptr;
  for (const xmlNode* c = metadata->children; c != nullptr; c = c->next)
    if (is_element(c, name) && ns_of(c) == ns) return c;
  return nullptr;
}

// C strtoul base 0, as libvirt reads address attributes: "0x.." hex, "0.." octal, else decimal.
std::optional<unsigned> parse_number(std::string_view text, unsigned max) {
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    base = 16;
    text.remove_prefix(2);
  } else if (text.size() > 1 && text[0] == '0') {
    base = 8;
    text.remove_prefix(1);
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty() || value > max) return std::nullopt;
  return value;
}

std::optional<std::string> pci_address(const xmlNode* address) {
  auto domain = attr(address, "domain");
  auto bus = attr(address, "bus");
  auto slot = attr(address, "slot");
  auto function = attr(address, "function");
  if (!bus || !slot || !function) return std::nullopt;
  auto d = domain ? parse_number(*domain, 0xffff) : std::optional<unsigned>{0};
  auto b = parse_number(*bus, 0xff);
  auto s = parse_number(*slot, 0x1f);
  auto f = parse_number(*function, 7);
  if (!d || !b || !s || !f) return std::nullopt;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", *d, *b, *s, *f);
  return std::string{buf};
}

// An element's text content (empty for none).
std::string text_of(const xmlNode* node) {
  if (node == nullptr) return {};
  xmlChar* content = xmlNodeGetContent(node);
  std::string out{sv(content)};
  xmlFree(content);
  return out;
}

std::string element_xml(const TerminationRecord& r, bool with_namespace) {
  init_libxml();
  xmlNode* node = xmlNewNode(nullptr, x("termination"));
  if (with_namespace) xmlNewNs(node, x(std::string{termination_ns}.c_str()), nullptr);
  xmlNewProp(node, x("reason"), x(r.reason.c_str()));
  xmlNewProp(node, x("at"), x(r.at.c_str()));
  xmlNewProp(node, x("by"), x(r.by.c_str()));
  xmlNewProp(node, x("audit-id"), x(r.audit_id.c_str()));
  xmlBuffer* buffer = xmlBufferCreate();
  xmlNodeDump(buffer, nullptr, node, 0, 0);
  std::string out{sv(xmlBufferContent(buffer))};
  xmlBufferFree(buffer);
  xmlFreeNode(node);
  return out;
}

// The PCI hostdevs' source addresses; `unreadable` counts those whose address cannot be read.
std::vector<std::string> addresses_of(const xmlDoc* doc, std::size_t* unreadable = nullptr) {
  std::vector<std::string> out;
  const xmlNode* root = xmlDocGetRootElement(doc);
  if (!is_element(root, "domain")) return out;
  const xmlNode* devices = first_child(root, "devices");
  if (devices == nullptr) return out;
  for (const xmlNode* hostdev = devices->children; hostdev != nullptr; hostdev = hostdev->next) {
    if (!is_element(hostdev, "hostdev") || attr(hostdev, "type") != "pci") continue;
    const xmlNode* source = first_child(hostdev, "source");
    const xmlNode* address = source == nullptr ? nullptr : first_child(source, "address");
    auto a = address == nullptr ? std::nullopt : pci_address(address);
    if (a) out.push_back(std::move(*a));
    else if (unreadable != nullptr) ++*unreadable;
  }
  std::ranges::sort(out);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<WorkloadLabel> workload_of(const xmlDoc* doc) {
  const xmlNode* element = find_metadata_element(doc, "workload", workload_ns);
  if (element == nullptr) return std::nullopt;
  auto vm_id = attr(element, "vm-id");
  auto org = attr(element, "org");
  auto tier_text = attr(element, "tier");
  if (!vm_id || vm_id->empty() || !org || org->empty() || !tier_text) return std::nullopt;
  auto tier = parse_tier(*tier_text);
  if (!tier) return std::nullopt;
  return WorkloadLabel{std::move(*vm_id), std::move(*org), *tier};
}

std::optional<TerminationRecord> termination_of(const xmlDoc* doc) {
  const xmlNode* element = find_metadata_element(doc, "termination", termination_ns);
  if (element == nullptr) return std::nullopt;
  return TerminationRecord{attr(element, "reason").value_or(""), attr(element, "at").value_or(""),
                           attr(element, "by").value_or(""), attr(element, "audit-id").value_or("")};
}

}  // namespace

std::vector<std::string> hostdev_pci_addresses(std::string_view domain_xml) {
  Doc doc = parse(domain_xml);
  return doc ? addresses_of(doc.get()) : std::vector<std::string>{};
}

std::optional<WorkloadLabel> parse_workload(std::string_view xml) {
  Doc doc = parse(xml);
  return doc ? workload_of(doc.get()) : std::nullopt;
}

std::optional<TerminationRecord> parse_termination(std::string_view xml) {
  Doc doc = parse(xml);
  return doc ? termination_of(doc.get()) : std::nullopt;
}

DomainXmlFacts parse_domain_xml(std::string_view domain_xml) {
  Doc doc = parse(domain_xml);
  if (!doc) return {};
  DomainXmlFacts facts;
  facts.pci_addresses = addresses_of(doc.get(), &facts.unreadable_pci_hostdevs);
  facts.label = workload_of(doc.get());
  facts.termination = termination_of(doc.get());
  const xmlNode* root = xmlDocGetRootElement(doc.get());
  facts.is_domain = is_element(root, "domain") && root->ns == nullptr;
  if (facts.is_domain) {
    facts.name = text_of(first_child(root, "name"));
    facts.uuid = text_of(first_child(root, "uuid"));
  }
  return facts;
}

std::string termination_xml(const TerminationRecord& record) { return element_xml(record, true); }
std::string termination_element(const TerminationRecord& record) { return element_xml(record, false); }

}  // namespace gpunode::vmctl
