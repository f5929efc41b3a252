"""What a Chrome/Perfetto trace must hold for the viewers to open it (Trace Event Format, JSON object form)."""

import json


def assert_valid_trace(path) -> list[dict]:
    """Loads the trace at ``path`` and checks its events; returns the complete ("X") events."""
    with open(path) as f:
        trace = json.load(f)
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} <= {"X", "M"}
    for e in events:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and isinstance(e["args"]["name"], str), e
        else:
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)), e
            assert e["ts"] >= 0 and e["dur"] >= 0, e
    complete = [e for e in events if e["ph"] == "X"]
    assert complete, "no complete events"
    return complete
