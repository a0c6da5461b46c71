"""The CLI tests' checks: one line per check, `N passed, M failed` at the end, exit 1 on a failure."""
import sys


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, name, cond, detail=""):
        if cond:
            self.passed += 1
            print(f"ok   {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}: {detail}")

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
