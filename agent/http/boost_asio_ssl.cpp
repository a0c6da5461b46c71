// Asio's TLS functions, compiled once (see boost_asio.cpp). Apart from boost_asio.cpp so that what
// needs no TLS (gpunodectl) links no OpenSSL.
#include <boost/asio/ssl/impl/src.hpp>
