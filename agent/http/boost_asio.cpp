// Asio's and Beast's own functions, compiled once for the whole project (their "separate
// compilation" mode, BOOST_ASIO_SEPARATE_COMPILATION and BOOST_BEAST_SEPARATE_COMPILATION, set for
// every target in the top CMakeLists.txt): the translation units that use them then only
// instantiate templates, which shortens every build (CI's three of them most).
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
