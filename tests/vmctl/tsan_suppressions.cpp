// ThreadSanitizer's suppressions for vmctl_test (read only in a -fsanitize=thread build). libvirt
// and GLib are not instrumented: GLib's mutexes are futexes and libvirt's objects count references
// with GLib atomics, none of which TSan sees, so it reports races and "destroy of a locked mutex"
// between their own threads' calls (seen with libvirt 9.0, GLib 2.74). `called_from_lib` ignores
// only what those libraries themselves do through TSan's interceptors; every access of our code,
// including the callbacks libvirt runs on its event-loop thread, is still checked.
// Exported (the build hides symbols by default): the sanitizer's runtime looks it up by name.
extern "C" __attribute__((visibility("default"))) const char* __tsan_default_suppressions();
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libvirt.so.0\n"
         "called_from_lib:libglib-2.0.so.0\n";
}
