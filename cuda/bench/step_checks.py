"""step_checks.py — the checks CSV of a result script's test and sanitizer steps (fwd_d256.sh,
bwd_d256.sh): one row per LOGS/test_cuda*.log and LOGS/sanitize_*.log, each step having written
LOG.cmd (its command, after "=== "), LOG.rc (its exit status) and LOG (its output).

    python3 step_checks.py OUT_CSV LOGS DATE DEVICE COMMIT

Columns: date, device, commit, command (the binary's directory dropped), status (pass, or the exit
status), assertions and test_cases (Catch2's summary), sanitizer_errors (the sum of the
compute-sanitizer summaries' errors or hazards; empty for a plain test). Each row is also printed.
"""
import csv
import glob
import re
import sys


def check_row(log, date, device, commit):
    cmd = open(log + ".cmd").readline().removeprefix("=== ").strip()
    cmd = re.sub(r"\S*/(test_cuda\S*)", r"\1", cmd)
    rc = open(log + ".rc").read().strip()
    text = open(log).read()
    passed = re.search(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", text)
    asserts = re.search(r"^assertions:\s*(\d+)", text, re.M)
    cases = re.search(r"^test cases:\s*(\d+)", text, re.M)
    if passed:
        a, c = passed.group(1), passed.group(2)
    else:
        a, c = (asserts.group(1) if asserts else ""), (cases.group(1) if cases else "")
    san = [int(x) for x in re.findall(r"(?:ERROR|RACECHECK) SUMMARY: (\d+) (?:error|hazard)", text)]
    return [date, device, commit, cmd, "pass" if rc == "0" else f"fail (rc {rc})", a, c, sum(san) if san else ""]


def main():
    if len(sys.argv) != 6:
        sys.exit("usage: step_checks.py OUT_CSV LOGS DATE DEVICE COMMIT")
    path, logs, date, device, commit = sys.argv[1:6]
    w = csv.writer(open(path, "w", newline=""), lineterminator="\n")
    w.writerow(["date", "device", "commit", "command", "status", "assertions", "test_cases", "sanitizer_errors"])
    for log in sorted(glob.glob(f"{logs}/test_cuda*.log")) + sorted(glob.glob(f"{logs}/sanitize_*.log")):
        row = check_row(log, date, device, commit)
        w.writerow(row)
        print("check:", ",".join(map(str, row[3:])))


if __name__ == "__main__":
    main()
