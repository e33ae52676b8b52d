"""Run a unittest suite and write one JSON line per test outcome (bench/peer-suite.sh).

Usage (inside the suite's source tree, with the driver under test importable):
    python peer_runner.py OUT.jsonl MODULE_OF_SUITE [only_module,...] [per_test_seconds]
A line is written as each test ends, so a run cut by the outer time limit keeps what it did.
A test still running after `per_test_seconds` gets a SIGALRM (reported as an error).
"""
import importlib
import json
import os
import signal
import sys
import time
import unittest


class Recorder(unittest.TestResult):
    def __init__(self, out, per_test):
        super().__init__()
        self.out = out
        self.per_test = per_test
        self.started = 0.0

    def _write(self, test, outcome, msg=""):
        first = ""
        for line in reversed((msg or "").strip().splitlines()):
            if line.strip():
                first = line.strip()
                break
        self.out.write(json.dumps({"id": test.id(), "outcome": outcome, "msg": first[:300],
                                   "secs": round(time.monotonic() - self.started, 2)}) + "\n")
        self.out.flush()

    def startTest(self, test):
        super().startTest(test)
        self.started = time.monotonic()
        signal.alarm(self.per_test)

    def stopTest(self, test):
        signal.alarm(0)
        super().stopTest(test)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._write(test, "ok")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._write(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._write(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._write(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._write(test, "ok", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._write(test, "fail", "unexpected success")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._write(subtest, "fail", self._exc_info_to_string(err, test))


def alarm(signum, frame):
    raise TimeoutError("test ran past the per-test time limit")


def main():
    out_path, module = sys.argv[1], sys.argv[2]
    only = [m for m in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if m]
    per_test = int(sys.argv[4]) if len(sys.argv) > 4 else 120
    signal.signal(signal.SIGALRM, alarm)
    # The suite's package is in the working directory, not beside this script.
    sys.path.insert(0, os.getcwd())
    if only:
        suite = unittest.TestSuite(
            importlib.import_module(f"{module}.{m}").test_suite() for m in only)
    else:
        suite = importlib.import_module(module).test_suite()
    with open(out_path, "w") as out:
        r = Recorder(out, per_test)
        suite.run(r)
    print(f"{r.testsRun} tests run: {len(r.failures)} failed, {len(r.errors)} errors, "
          f"{len(r.skipped)} skipped", file=sys.stderr)


if __name__ == "__main__":
    main()
