"""Runs a package's unittest suite and writes one line per test: '<id> <outcome>'.

    python3 tests/gpu/suite.py OUTCOMES_FILE numba.cuda.tests.cudadrv [MORE_NAMES...]

Outcomes are ok, fail, error, skip, xfail, xpass. Used by scripts/gpu-check.sh to compare a
client's own test suite with and without cudapool; the unittest runner's text output still goes
to stderr for the log.
"""

import sys
import unittest


class Recording(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes[test.id()] = "ok"

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[test.id()] = "fail"

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[test.id()] = "error"

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes[test.id()] = "skip"

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.outcomes[test.id()] = "xfail"

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.outcomes[test.id()] = "xpass"

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self.outcomes[test.id()] = "fail"


def main():
    path, names = sys.argv[1], sys.argv[2:]
    name = " ".join(names)
    suite = unittest.defaultTestLoader.loadTestsFromNames(names)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=Recording)
    result = runner.run(suite)
    with open(path, "w") as f:
        for test_id, outcome in sorted(result.outcomes.items()):
            # A subtest failure recorded before the test's own success stays a failure.
            f.write(f"{test_id} {outcome}\n")
    print(f"{name}: ran {result.testsRun}, " + ", ".join(
        f"{k} {sum(1 for v in result.outcomes.values() if v == k)}"
        for k in ("ok", "fail", "error", "skip")))


if __name__ == "__main__":
    main()
