// http::Server's life: the shared state's session registry, the observer and logger, graceful shutdown.
// The listeners and their budgets are in listeners.cpp, one connection's HTTP in session.cpp.
#include "gpunode/http/server.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>

#include "server_state.hpp"

namespace gpunode::http {

namespace detail {

void ServerState::observe(const Answered& a) const {
  if (!observer) return;
  try {
    observer(a);
  } catch (...) {  // an observer that throws must not take a connection down
  }
}

void ServerState::log(std::string_view message) const {
  if (!log_fn) return;
  try {
    log_fn(message);
  } catch (...) {  // a logger that throws must not take a connection down
  }
}

std::pair<std::uint64_t, bool> ServerState::add(std::weak_ptr<SessionBase> s) {
  std::lock_guard lock(mu);
  auto id = ++next_id;
  sessions.emplace(id, std::move(s));
  return {id, draining};
}

void ServerState::remove(std::uint64_t id) {
  std::vector<std::function<void()>> fire;
  {
    std::lock_guard lock(mu);
    sessions.erase(id);
    if (draining && sessions.empty() && !done.empty()) {
      fire.swap(done);
      if (drain_timer) drain_timer->cancel();
    }
  }
  for (auto& f : fire) net::post(io, std::move(f));
}

std::vector<std::shared_ptr<SessionBase>> ServerState::live() {
  std::vector<std::shared_ptr<SessionBase>> out;
  std::lock_guard lock(mu);
  for (auto& [id, w] : sessions) {
    if (auto s = w.lock()) out.push_back(std::move(s));
  }
  return out;
}

std::shared_ptr<ssl::context> ServerState::current_tls() const {
  std::lock_guard lock(mu);
  return tls;
}

}  // namespace detail

Server::Server(net::io_context& io, Limits limits, Handler handler, std::function<void(std::string_view)> log,
               Observer observer)
    : state_(std::make_shared<detail::ServerState>(io, limits, std::move(handler), std::move(log),
                                                   std::move(observer))) {}

Server::~Server() {
  state_->stop_accepting();
  auto live = state_->live();
  for (auto& s : live) s->force_close();
}

void Server::set_tls_context(std::shared_ptr<ssl::context> tls) {
  if (!tls) return;
  std::lock_guard lock(state_->mu);
  state_->tls = std::move(tls);
}

void Server::recheck_access() {
  state_->access_generation.fetch_add(1, std::memory_order_acq_rel);
  auto live = state_->live();
  for (auto& s : live) s->recheck();
}

std::uint16_t Server::tls_port() const {
  std::lock_guard lock(state_->mu);
  return state_->port;
}

void Server::stop_accepting() {
  state_->stop_accepting();
}

void Server::shutdown(std::chrono::milliseconds drain, std::function<void()> done) {
  state_->stop_accepting();
  std::vector<std::function<void()>> fire;
  std::vector<std::shared_ptr<detail::SessionBase>> live;  // released after the lock
  {
    std::lock_guard lock(state_->mu);
    state_->draining = true;
    for (auto& [id, w] : state_->sessions) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
    if (done) state_->done.push_back(std::move(done));
    if (state_->sessions.empty()) {
      fire.swap(state_->done);
    } else {
      state_->drain_timer = std::make_unique<net::steady_timer>(state_->io, drain);
      state_->drain_timer->async_wait([st = state_](boost::system::error_code ec) {
        if (ec) return;
        auto remaining = st->live();
        if (!remaining.empty())
          st->log(fmt::format("http: closing {} connection(s) still open after the drain", remaining.size()));
        for (auto& s : remaining) s->force_close();
      });
    }
  }
  for (auto& f : fire) net::post(state_->io, std::move(f));
  for (auto& s : live) s->drain();
}

std::size_t Server::open_connections() const {
  std::lock_guard lock(state_->mu);
  return state_->sessions.size();
}

}  // namespace gpunode::http
