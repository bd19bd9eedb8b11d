"""Memory of the running process, for the benchmarks that run each case in a fresh process."""

import resource


def rss() -> int:
    """Resident set size now, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak() -> int:
    """The process's RSS high-water mark, in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
