"""The ri2n benchmark driver (`bench/run-all`; `python3 bench/ri2nbench --help`).

common: paths, processes, statistics, machine facts, results files and the doc's blocks;
labctl: the namespace lab through lab/ri2n-lab; analysis: 10 ms goodput timelines and the
recovery rule; one module per part (loopback, lab, fast, fault, sweep, keyed, tunnel), each
with its measurement (part_*) and its block of docs/BENCHMARKS.md (report_*).
"""
