// fmt's compiled functions, linked into gpunode-agent itself, as fmt's own src/format.cc builds
// them into libfmt (fmt 9, Debian 12's; fmt 10, Debian 13's): the executable maps libc alone
// (module_abi.hpp), and libfmt.so would bring libstdc++.so with it. The project's libraries are compiled
// against fmt's headers as usual; their references to these functions resolve here, and the linker, which
// sees them defined, needs no libfmt.so (--as-needed, agent/CMakeLists.txt).
#include <fmt/format-inl.h>

// fmt names these internals differently in each major version. A version this file does not know
// must fail here, not link: libfmt.so, still on the link line through the static libraries, would
// quietly supply what is missing and bring libstdc++.so back into the hook's process.
#if FMT_VERSION < 90000 || FMT_VERSION >= 110000
#error "fmt_compiled.cpp knows fmt 9 and 10: add this version's instantiations from its src/format.cc"
#endif

FMT_BEGIN_NAMESPACE
namespace detail {

template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;

#ifndef FMT_STATIC_THOUSANDS_SEPARATOR
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
#endif

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);
#if FMT_VERSION >= 100000  // fmt 10 names the arguments' type through vformat_args
template FMT_API void vformat_to(buffer<char>&, string_view, typename vformat_args<>::type, locale_ref);
#else
template FMT_API void vformat_to(buffer<char>&, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>,
                                 locale_ref);
#endif

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API void buffer<wchar_t>::append(const wchar_t*, const wchar_t*);

}  // namespace detail
FMT_END_NAMESPACE
