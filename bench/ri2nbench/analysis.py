"""Goodput timelines on a 10 ms grid, and the failover and recovery rule read off them."""
import math
import statistics



BIN = 0.01


def uniform_series(rows, total):
    """Spreads each interval's bytes evenly over [start, end) on a BIN grid; bits/s per bin."""
    nb = int(total / BIN) + 1
    acc = [0.0] * nb
    for r in rows:
        s, e, b = r["start"], r["end"], r["bytes"]
        if e <= s:
            continue
        rate = b / (e - s)
        k = int(s / BIN)
        while k < nb and k * BIN < e:
            lo, hi = max(s, k * BIN), min(e, (k + 1) * BIN)
            if hi > lo:
                acc[k] += rate * (hi - lo)
            k += 1
    return [x * 8 / BIN for x in acc]


def recovery(series, t_event, target_bps, t_limit, binw=BIN, window=0.1):
    """Time from t_event to the start of the first bin that starts at or after t_event and
    whose own goodput and the mean goodput of the `window` starting with it are both >= target.
    None if not reached before t_limit. Not the bin holding t_event: what it counted came
    mostly before the event, and its window takes in the burst that ends a stall, so a stall
    right after the event would read as no gap at all."""
    w = max(1, int(round(window / binw)))
    # rounded first: a time on a bin's edge divides to just below or above its index
    k = math.ceil(round(t_event / binw, 6))
    while k * binw < t_limit and k + w <= len(series):
        if series[k] >= target_bps and sum(series[k:k + w]) / w >= target_bps:
            return max(0.0, k * binw - t_event)
        k += 1
    return None


def longest_stall(series, t_from, t_to, level_bps, binw=BIN):
    """Longest run of consecutive bins below level within [t_from, t_to), in seconds."""
    best = cur = 0
    # the bins that start before t_to (rounded first: a time on a bin's edge divides to
    # just below or above its index)
    end = math.ceil(round(t_to / binw, 6))
    for k in range(int(t_from / binw), min(len(series), end)):
        if series[k] < level_bps:
            cur += 1
            best = max(best, cur)
        else:
            cur = 0
    return best * binw


def analyse(series, events, seconds, per_link_cap, binw=BIN):
    """Failover gaps and recovery times of one run (see docs/BENCHMARKS.md for the rule)."""
    # steady state: from 0.3 s (after start-up) to just before the first fault
    ss_hi = (events[0]["t_bench"] if events else seconds) - 0.05
    k0, k1 = int(0.3 / binw), int(ss_hi / binw)
    ss = statistics.mean(series[k0:k1]) if k1 > k0 else None  # both links, before any fault
    down = set()
    out = []
    times = [e["t_bench"] for e in events] + [seconds]
    for i, e in enumerate(events):
        nxt = times[i + 1]
        if e["action"] == "fault":
            down.add(e["link"])
        else:
            down.discard(e["link"])
        up = 2 - len(down)
        m = {"t": e["t"], "action": e["action"], "link": e["link"], "t_bench": e["t_bench"],
             "links_up": up}
        if up > 0 and nxt - e["t_bench"] > 0.05:
            cap = up * per_link_cap
            # one link: its payload limit; both links: the lower of their limit and what the
            # tool itself carried on both before the first fault (a shortfall there is part 2's
            # figure, not a recovery problem)
            own = ss if (up == 2 and ss) else cap
            target = 0.9 * min(cap, own)
            m["target_bps"] = target
            m["target_is_capacity"] = cap <= own
            m["time_to_90"] = recovery(series, e["t_bench"], target, nxt, binw, max(0.1, binw))
            m["stall"] = longest_stall(series, e["t_bench"], nxt, 0.1 * cap, binw)
            k = int(e["t_bench"] / binw) + 1
            m["min_bin_200ms"] = min(series[k:k + int(round(0.2 / binw))] or [0])
        elif up == 0:
            # time until goodput is zero in every later bin before the next event: not a metric
            m["stall"] = None
        out.append(m)
    return {"steady_bps": ss, "events": out}


def flow_series(doc, t0, seconds):
    """mptcp_flow.py's receiver bins (aligned to the monotonic clock) shifted to the sender's
    start t0: bits/s per BIN from 0 to `seconds`."""
    shift = doc["t_first"] - t0
    nb = int(seconds / BIN) + 1
    series = [0.0] * nb
    for i, b in enumerate(doc["bytes"]):
        k = int(round((shift + i * BIN) / BIN))
        if 0 <= k < nb:
            series[k] += b * 8 / BIN
    return series
