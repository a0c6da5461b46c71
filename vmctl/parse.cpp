// Pure parsers of domain XML and metadata elements (CONTRACT §5), over libxml2.
#include <libxml/parser.h>
#include <libxml/parserInternals.h>
#include <libxml/tree.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdio>
#include <memory>
#include <mutex>

#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::vmctl {
namespace {

// libxml2 speaks unsigned char; BAD_CAST is a C cast, so these replace it.
const xmlChar* x(const char* text) {
  return reinterpret_cast<const xmlChar*>(text);
}
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
std::string_view ns_of(const xmlNode* node) {
  return node->ns == nullptr ? std::string_view{} : sv(node->ns->href);
}

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
  if (is_element(root, "metadata") && root->ns == nullptr)
    metadata = root;
  else if (is_element(root, "domain") && root->ns == nullptr)
    metadata = first_child(root, "metadata");
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
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty() || value > max)
    return std::nullopt;
  return value;
}

// "dddd:bb:ss.f" from an <address>'s attributes, read by `attr` (name -> optional value).
template <typename Attr>
std::optional<std::string> pci_address_from(Attr attr) {
  auto domain = attr("domain");
  auto bus = attr("bus");
  auto slot = attr("slot");
  auto function = attr("function");
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

std::optional<std::string> pci_address(const xmlNode* address) {
  return pci_address_from([&](const char* name) { return attr(address, name); });
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
    if (a)
      out.push_back(std::move(*a));
    else if (unreadable != nullptr)
      ++*unreadable;
  }
  std::ranges::sort(out);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The §5 elements from their attributes, read by `attr` (name -> optional value), as the tree
// and the SAX reading both do.
template <typename Attr>
std::optional<WorkloadLabel> workload_from(Attr attr) {
  auto vm_id = attr("vm-id");
  auto org = attr("org");
  auto tier_text = attr("tier");
  if (!vm_id || vm_id->empty() || !org || org->empty() || !tier_text) return std::nullopt;
  auto tier = parse_tier(*tier_text);
  if (!tier) return std::nullopt;
  return WorkloadLabel{std::move(*vm_id), std::move(*org), *tier};
}
template <typename Attr>
TerminationRecord termination_from(Attr attr) {
  return TerminationRecord{attr("reason").value_or(""), attr("at").value_or(""), attr("by").value_or(""),
                           attr("audit-id").value_or("")};
}

std::optional<WorkloadLabel> workload_of(const xmlDoc* doc) {
  const xmlNode* element = find_metadata_element(doc, "workload", workload_ns);
  if (element == nullptr) return std::nullopt;
  return workload_from([&](const char* name) { return attr(element, name); });
}

std::optional<TerminationRecord> termination_of(const xmlDoc* doc) {
  const xmlNode* element = find_metadata_element(doc, "termination", termination_ns);
  if (element == nullptr) return std::nullopt;
  return termination_from([&](const char* name) { return attr(element, name); });
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

namespace detail {

DomainXmlFacts parse_domain_xml_tree(std::string_view domain_xml) {
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

}  // namespace detail

namespace {

// parse_domain_xml in one pass of SAX events, without the tree: the same answers as the tree
// readers above (detail::parse_domain_xml_tree), at a third of the cost (list() parses every
// domain's XML on every listing). The rules restated over events, element by element:
//   - an element's name is its local name, except with a prefix bound to no namespace (the tree
//     then names it "p:local", which matches none of the names looked for);
//   - <domain> (any namespace) at the root: its first <devices>; each <hostdev> there with type
//     "pci" counts, read from its first <source>'s first <address>;
//   - <domain> in no namespace: its first <name> and <uuid> (all their text) and its first
//     <metadata>, in which the first <workload> and <termination> in their §5 namespaces count;
//   - a root <metadata> in no namespace holds them the same way; a root <workload> or
//     <termination> (in no namespace or in its own) is itself the element.
// A document with a DTD, or an attribute read here whose value holds '&' (SAX hands "&amp;" over
// as "&#38;", to be decoded by whoever builds a tree), goes to the tree readers instead: rare, and
// never worth a second set of rules.
struct Scan {
  enum class Role { none, devices, pci_hostdev, source, metadata, text };
  struct Open {
    Role role = Role::none;
    bool saw_source = false;   // pci_hostdev: its first <source> was opened
    bool saw_address = false;  // source: its first <address> was read
  };
  std::vector<Open> stack;  // the open elements, the root first
  bool fallback = false;
  bool root_domain = false;  // <domain> at the root, any namespace
  bool saw_devices = false, saw_metadata = false, saw_name = false, saw_uuid = false;
  bool saw_workload = false, saw_termination = false;
  std::string* text = nullptr;         // where character data goes while a Role::text element is open
  std::optional<std::string> address;  // the current pci hostdev's address, when read
  DomainXmlFacts facts;
};

struct Name {
  std::string_view local;
  std::string_view ns;   // empty: no namespace
  bool unbound = false;  // a prefix bound to no namespace: matches no name looked for
  bool is(std::string_view want) const { return !unbound && local == want; }
};

// One attribute in no namespace; nullopt when absent. Sets `fallback` on a value holding '&'.
std::optional<std::string> sax_attr(Scan& s, int count, const xmlChar** attrs, std::string_view want) {
  for (int i = 0; i < count; ++i) {
    const xmlChar** a = attrs + 5 * i;  // local name, prefix, URI, value, end of value
    if (a[1] != nullptr || a[2] != nullptr || sv(a[0]) != want) continue;
    std::string value(reinterpret_cast<const char*>(a[3]), static_cast<std::size_t>(a[4] - a[3]));
    if (value.find('&') != std::string::npos) s.fallback = true;
    return value;
  }
  return std::nullopt;
}

std::optional<std::string> sax_pci_address(Scan& s, int count, const xmlChar** attrs) {
  return pci_address_from([&](const char* name) { return sax_attr(s, count, attrs, name); });
}

void sax_workload(Scan& s, int count, const xmlChar** attrs) {
  s.facts.label = workload_from([&](const char* name) { return sax_attr(s, count, attrs, name); });
}

void sax_termination(Scan& s, int count, const xmlChar** attrs) {
  s.facts.termination = termination_from([&](const char* name) { return sax_attr(s, count, attrs, name); });
}

// A child of a <metadata> that counts: the first <workload> and <termination> in their namespaces.
void sax_metadata_child(Scan& s, const Name& n, int count, const xmlChar** attrs) {
  if (!s.saw_workload && n.is("workload") && n.ns == workload_ns) {
    s.saw_workload = true;
    sax_workload(s, count, attrs);
  } else if (!s.saw_termination && n.is("termination") && n.ns == termination_ns) {
    s.saw_termination = true;
    sax_termination(s, count, attrs);
  }
}

Scan& scan_of(void* ctx) {
  return *static_cast<Scan*>(static_cast<xmlParserCtxt*>(ctx)->_private);
}

void on_start(Scan& s, const xmlChar* local, const xmlChar* prefix, const xmlChar* uri, int nb_attributes,
              const xmlChar** attrs) {
  const Name n{sv(local), sv(uri), prefix != nullptr && uri == nullptr};
  const std::size_t depth = s.stack.size();
  Scan::Open open;
  if (depth == 0) {
    s.root_domain = n.is("domain");
    s.facts.is_domain = s.root_domain && n.ns.empty();
    if (n.is("workload") && (n.ns.empty() || n.ns == workload_ns)) {
      s.saw_workload = true;
      sax_workload(s, nb_attributes, attrs);
    } else if (n.is("termination") && (n.ns.empty() || n.ns == termination_ns)) {
      s.saw_termination = true;
      sax_termination(s, nb_attributes, attrs);
    } else if (n.is("metadata") && n.ns.empty()) {
      open.role = Scan::Role::metadata;
    }
  } else {
    const Scan::Open& parent = s.stack.back();
    if (depth == 1 && s.root_domain) {
      if (!s.saw_devices && n.is("devices")) {
        s.saw_devices = true;
        open.role = Scan::Role::devices;
      } else if (s.facts.is_domain && !s.saw_metadata && n.is("metadata")) {
        s.saw_metadata = true;
        open.role = Scan::Role::metadata;
      } else if (s.facts.is_domain && !s.saw_name && n.is("name")) {
        s.saw_name = true;
        open.role = Scan::Role::text;
        s.text = &s.facts.name;
      } else if (s.facts.is_domain && !s.saw_uuid && n.is("uuid")) {
        s.saw_uuid = true;
        open.role = Scan::Role::text;
        s.text = &s.facts.uuid;
      }
    } else if (parent.role == Scan::Role::devices) {
      if (n.is("hostdev") && sax_attr(s, nb_attributes, attrs, "type") == "pci") {
        open.role = Scan::Role::pci_hostdev;
        s.address.reset();
      }
    } else if (parent.role == Scan::Role::pci_hostdev) {
      if (!parent.saw_source && n.is("source")) {
        s.stack.back().saw_source = true;
        open.role = Scan::Role::source;
      }
    } else if (parent.role == Scan::Role::source) {
      if (!parent.saw_address && n.is("address")) {
        s.stack.back().saw_address = true;
        s.address = sax_pci_address(s, nb_attributes, attrs);
      }
    } else if (parent.role == Scan::Role::metadata) {
      sax_metadata_child(s, n, nb_attributes, attrs);
    }
  }
  s.stack.push_back(open);
}

void on_end(Scan& s) {
  if (s.stack.empty()) return;
  switch (s.stack.back().role) {
    case Scan::Role::pci_hostdev:
      if (s.address)
        s.facts.pci_addresses.push_back(std::move(*s.address));
      else
        ++s.facts.unreadable_pci_hostdevs;
      s.address.reset();
      break;
    case Scan::Role::text:
      s.text = nullptr;
      break;
    default:
      break;
  }
  s.stack.pop_back();
}

// libxml2's callbacks (C): each hands its event to the reading above. The tree readers take over
// when the document needs them (a DTD; an entity reference, which without a DTD cannot occur and
// is caught here only in case) or when the reading throws (it allocates): an exception must not
// unwind through libxml2's C frames.
void sax_to_tree(void* ctx) {
  scan_of(ctx).fallback = true;
  xmlStopParser(static_cast<xmlParserCtxt*>(ctx));
}
template <typename Reading>
void guarded(void* ctx, Reading reading) {
  try {
    reading(scan_of(ctx));
  } catch (...) {
    sax_to_tree(ctx);
  }
}
void sax_start(void* ctx, const xmlChar* local, const xmlChar* prefix, const xmlChar* uri,
               int /*nb_namespaces*/, const xmlChar** /*namespaces*/, int nb_attributes, int /*nb_defaulted*/,
               const xmlChar** attrs) {
  guarded(ctx, [&](Scan& s) { on_start(s, local, prefix, uri, nb_attributes, attrs); });
}
void sax_end(void* ctx, const xmlChar* /*local*/, const xmlChar* /*prefix*/, const xmlChar* /*uri*/) {
  guarded(ctx, [](Scan& s) { on_end(s); });
}
// All the text inside <name> or <uuid>, at any depth (as xmlNodeGetContent gives it).
void sax_characters(void* ctx, const xmlChar* text, int length) {
  guarded(ctx, [&](Scan& s) {
    if (s.text != nullptr && length > 0)
      s.text->append(reinterpret_cast<const char*>(text), static_cast<std::size_t>(length));
  });
}
void sax_subset(void* ctx, const xmlChar* /*name*/, const xmlChar* /*external_id*/,
                const xmlChar* /*system_id*/) {
  sax_to_tree(ctx);
}
void sax_reference(void* ctx, const xmlChar* /*name*/) {
  sax_to_tree(ctx);
}
void sax_silent(void* /*user_data*/, xmlError* /*error*/) {}

// One pass; nullopt when the document needs the tree readers (see Scan).
std::optional<DomainXmlFacts> scan_domain_xml(std::string_view text) {
  init_libxml();
  if (text.empty() || text.size() > static_cast<std::size_t>(INT_MAX)) return DomainXmlFacts{};
  xmlParserCtxt* ctxt = xmlCreateMemoryParserCtxt(text.data(), static_cast<int>(text.size()));
  if (ctxt == nullptr) return std::nullopt;
  const std::unique_ptr<xmlParserCtxt, void (*)(xmlParserCtxt*)> owned{ctxt, xmlFreeParserCtxt};
  xmlSAXHandler handler{};
  handler.initialized = XML_SAX2_MAGIC;
  handler.startElementNs = sax_start;
  handler.endElementNs = sax_end;
  handler.characters = sax_characters;
  handler.ignorableWhitespace = sax_characters;
  handler.cdataBlock = sax_characters;
  handler.internalSubset = sax_subset;
  handler.externalSubset = sax_subset;
  handler.reference = sax_reference;
  handler.serror = sax_silent;
  *ctxt->sax = handler;
  constexpr int options = XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING | XML_PARSE_NOCDATA;
  xmlCtxtUseOptions(ctxt, options);
  Scan scan;
  ctxt->_private = &scan;
  xmlParseDocument(ctxt);
  if (scan.fallback) return std::nullopt;
  if (ctxt->wellFormed == 0) return DomainXmlFacts{};
  DomainXmlFacts& facts = scan.facts;
  std::ranges::sort(facts.pci_addresses);
  facts.pci_addresses.erase(std::unique(facts.pci_addresses.begin(), facts.pci_addresses.end()),
                            facts.pci_addresses.end());
  return std::move(facts);
}

}  // namespace

DomainXmlFacts parse_domain_xml(std::string_view domain_xml) {
  if (auto facts = scan_domain_xml(domain_xml)) return std::move(*facts);
  return detail::parse_domain_xml_tree(domain_xml);
}

std::string termination_xml(const TerminationRecord& record) {
  return element_xml(record, true);
}
std::string termination_element(const TerminationRecord& record) {
  return element_xml(record, false);
}

}  // namespace gpunode::vmctl
