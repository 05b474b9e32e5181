// One error type for every failure a user can cause: its message is one sentence naming the
// thing and what to do. Front ends print it and exit 1; nothing below them prints or exits.
#pragma once
#include <stdexcept>
#include <string>

namespace nt {

struct Error : std::runtime_error {
    explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// printf-style helper so call sites stay one line.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace nt
