"""spectrace report: the page's data against the trace, and the page itself in a real browser
(Debian's chromium through selenium and chromedriver): the summary's numbers, the text's token
classes, the tree of every phase of a step stepped through with the keys, the console, and
hostile traces that must run nothing. The browser tests skip where there is no chromium unless
SPECTRACE_BROWSER_TESTS=1 (.ci/run sets it, and installs the browser)."""
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spectrace.cli import main
from spectrace.core.trace_reader import TraceFile
from spectrace.traces import open_trace
from spectrace.report.data import report_data
from spectrace.report.page import inert_json, page
from spectrace.viz.steptree import step_tree
from spectrace.viz.tui import panels

ROOT = Path(__file__).resolve().parent.parent
# a run of each drafter and each acceptance rule, the fast engine, a batch, a steps-level trace
RUNS = {
    "none": ["--algo", "none"],
    "standalone": ["--algo", "standalone"],
    "eagle": ["--algo", "eagle", "--topk", "4"],
    "eagle3": ["--algo", "eagle3"],
    "mtp": ["--algo", "mtp"],
    "frozen_kv_mtp": ["--algo", "frozen_kv_mtp"],
    "medusa-typical": ["--algo", "medusa", "--acceptance", "typical", "--temperature", "1"],
    "dflash": ["--algo", "dflash"],
    "ngram": ["--algo", "ngram", "--prompt-lookup-min", "1", "--prompt-lookup-max", "3"],
    "target_only": ["--algo", "eagle", "--acceptance", "target_only", "--temperature", "1"],
    "rejection": ["--algo", "eagle", "--topk", "1", "--acceptance", "rejection", "--temperature", "1"],
    "vllm": ["--algo", "standalone", "--acceptance", "vllm", "--temperature", "1"],
    "tree_rejection": ["--algo", "eagle", "--acceptance", "tree_rejection", "--temperature", "1"],
    "adaptive": ["--algo", "eagle", "--speculative-adaptive"],
    "steps-level": ["--algo", "eagle", "--trace-level", "steps"],
    "fast": ["--algo", "eagle3", "--backend", "fast"],
    "batch": ["--algo", "eagle", "--batch", "3"],
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    made, root = {}, tmp_path_factory.mktemp("report-traces")

    def make(name):
        if name not in made:
            path = root / f"{name}.jsonl"
            assert main(["run", "--no-tui", "--max-new-tokens", "10", "--trace", str(path), *RUNS[name]]) == 0
            made[name] = path
        return made[name]
    return make


def token_classes(trace: TraceFile, request: int) -> list[str]:
    """How each generated token of a request came, from its records."""
    out = ["tok-prefill"]
    for i, meta in enumerate(trace.index):
        if meta.request != request:
            continue
        rec = trace.step(i)
        drafted = rec["draft"] is not None and len(rec["draft"]["tokens"]) > 0
        for k, _ in enumerate(meta.committed):
            out.append("tok-plain" if not drafted else f"tok-draft d{min(k + 1, 8)}"
                       if k < len(rec["correct_drafts"]) else "tok-bonus")
    return out


# ---- the data, without a browser --------------------------------------------------------------
@pytest.mark.parametrize("name", ["eagle", "none", "medusa-typical", "ngram", "fast", "batch"])
def test_the_pages_data_is_every_step_once_as_the_viewers_read_it(traces, name):
    trace = open_trace(traces(name))
    data = report_data(trace)
    assert len(data["steps"]) == len(trace)
    for i, s in enumerate(data["steps"]):
        rec, nodes = trace.step(i), step_tree(trace.step(i), trace.token_text)
        assert (s["s"], s["r"], s["al"], s["c"]) == (rec["step"], rec["request"], rec["accept_len"],
                                                       rec["committed_tokens"])
        assert [(n[0], n[1], n[2], data["fates"][n[3]]) for n in s["n"]] == \
            [(n.token, -1 if n.parent is None else n.parent, n.depth, n.fate) for n in nodes]
        phases = panels.phases_of(rec, trace.header["config"]["algo"])
        assert s["levels"] == sum(p.startswith("DRAFT") for p in phases)
    m = trace.summary["metrics"]
    assert data["summary"]["accept_length"] == m["accept_length"] and data["summary"]["verify_ct"] == m["verify_ct"]


@pytest.mark.parametrize("name", ["eagle", "batch", "none"])
def test_a_trace_without_its_summary_gets_the_summarys_numbers_from_its_steps(traces, tmp_path, name):
    full = open_trace(traces(name))
    lines = traces(name).read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-1]))  # the run killed before its summary
    derived, m = report_data(open_trace(cut))["summary"], full.summary["metrics"]
    assert derived["derived"] is True
    for key in ("completion_tokens", "verify_ct", "accept_length", "accept_rate", "accept_len_histogram"):
        assert derived[key] == m[key], key
    assert derived["per_position"] == m["vllm"]["per_position_acceptance_rate"]


@given(st.recursive(st.text() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.none(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20))
def test_inert_json_reads_back_exactly_and_cannot_end_its_script_element(value):
    text = inert_json(value)
    assert json.loads(text) == value
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}


def test_the_page_lets_only_its_own_script_run(traces):
    import base64
    import hashlib
    import re

    html = page(report_data(open_trace(traces("eagle"))), "t")
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert len(scripts) == 1 and "default-src 'none'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp
    assert not re.search(r"\b(src|href)=", html.replace('id="trace-data"', ""))  # nothing fetched


def test_report_command_errors_are_one_line_and_exit_2(tmp_path, capsys, traces):
    assert main(["report", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "r.html")]) == 2
    assert main(["report", str(traces("eagle")), "-o", str(tmp_path / "no" / "dir" / "r.html")]) == 2
    assert main(["run", "--no-tui", "--trace-level", "off", "--report", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("spectrace: error: ") for line in err)
    assert not (tmp_path / "r.html").exists() and not list(tmp_path.glob("*.part"))


def test_run_report_writes_the_page_of_its_trace(tmp_path, capsys):
    trace, out = tmp_path / "t.jsonl", tmp_path / "r.html"
    assert main(["run", "--no-tui", "--max-new-tokens", "6", "--trace", str(trace), "--report", str(out)]) == 0
    assert f"report: {out}" in capsys.readouterr().out
    assert out.read_text().count('id="trace-data"') == 1


# ---- the page, in chromium ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    from spectrace.report.browser import headless_chromium, missing

    lacking = missing()
    if lacking:
        if os.environ.get("SPECTRACE_BROWSER_TESTS") == "1":
            pytest.fail(f"SPECTRACE_BROWSER_TESTS=1 but there is no {', '.join(lacking)}")
        pytest.skip(f"no {', '.join(lacking)} (apt-get install chromium chromium-driver; pip install selenium)")
    with headless_chromium() as driver:
        yield driver


def open_page(browser, trace_path, tmp_path) -> Path:
    out = tmp_path / "report.html"
    assert main(["report", str(trace_path), "-o", str(out)]) == 0
    browser.get(out.as_uri())
    assert browser.find_element("tag name", "body").get_attribute("data-ready") == "1"
    return out


def console_errors(browser) -> list:
    return [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def press(browser, key, times=1):
    from selenium.webdriver.common.action_chains import ActionChains

    for _ in range(times):
        ActionChains(browser).send_keys(key).perform()


def test_the_page_shows_the_traces_summary_text_and_trees_step_by_step(browser, traces, tmp_path):
    from selenium.webdriver.common.keys import Keys

    path = traces("eagle")
    trace = open_trace(path)
    open_page(browser, path, tmp_path)
    by_id = lambda i: browser.find_element("id", i).text  # noqa: E731
    m = trace.summary["metrics"]
    assert (by_id("sum-tau"), by_id("sum-alpha"), by_id("sum-verify"), by_id("sum-tokens")) == (
        f"{m['accept_length']:.3f}", f"{m['accept_rate']:.3f}", str(m["verify_ct"]), str(m["completion_tokens"]))
    spans = browser.find_elements("css selector", "#text .tok")
    classes = [" ".join(c for c in s.get_attribute("class").split() if c not in ("tok", "current")) for s in spans]
    assert classes == token_classes(trace, 0)
    assert len(spans) == len(trace.summary["requests"][0]["output_ids"])
    assert sum(c.startswith("tok-draft") for c in classes) == m["num_correct_drafts"]
    bars = browser.find_elements("css selector", "#chart-position rect")
    assert len(bars) == len(m["vllm"]["per_position_acceptance_rate"])
    # the keys walk every phase of the first two steps; the tree shows what the walkthrough's does
    for i in range(2):
        rec = trace.step(i)
        nodes = step_tree(rec, trace.token_text)
        for phase in panels.phases_of(rec, "eagle"):
            assert browser.find_element("id", "phases").get_attribute("data-current") == phase
            drawn = browser.find_elements("css selector", "#tree g.node")
            assert len(drawn) == len(panels.visible_nodes(nodes, phase)), (i, phase)
            press(browser, Keys.ARROW_RIGHT)
    assert by_id("step-label").startswith(f"step {trace.step(2)['step']} ")
    press(browser, Keys.PAGE_UP)
    assert by_id("step-label").startswith(f"step {trace.step(1)['step']} ")
    last = browser.find_elements("css selector", "#tree g.node")[-1]
    index = last.get_attribute("data-node")
    last.click()  # the inspector follows a click
    assert by_id("inspector").splitlines()[0] == f"node {index}"
    assert console_errors(browser) == []


def test_the_readme_picture_is_the_committed_runs_page(browser, tmp_path):
    """tests/data/walkthrough.jsonl's page at the ACCEPT of a step; SPECTRACE_UPDATE_SCREENSHOT=1
    writes it to docs/report.png (README's picture), else beside the test."""
    from selenium.webdriver.common.keys import Keys

    trace = TraceFile(ROOT / "tests" / "data" / "walkthrough.jsonl")
    open_page(browser, trace.path, tmp_path)
    press(browser, Keys.PAGE_DOWN, 2)
    phases = panels.phases_of(trace.step(2), trace.header["config"]["algo"])
    press(browser, Keys.ARROW_RIGHT, phases.index("ACCEPT"))
    assert browser.find_element("id", "phases").get_attribute("data-current") == "ACCEPT"
    assert len(browser.find_elements("css selector", "#tree g.node")) == len(step_tree(trace.step(2), trace.token_text))
    assert console_errors(browser) == []
    out = ROOT / "docs" / "report.png" if os.environ.get("SPECTRACE_UPDATE_SCREENSHOT") == "1" else tmp_path / "r.png"
    assert browser.get_screenshot_as_file(str(out))


HOSTILE = ['</script><script>window.__pwned = 1</script>', '<img src=x onerror="window.__pwned = 2">',
           '"><svg onload="window.__pwned=3">', "javascript:window.__pwned=4", "\u202e\u0007<b>bold</b>"]


def hostile_copy(path: Path, out: Path) -> Path:
    """The trace with every token text, the prompts, the model names, the acceptance rule and KV
    event names replaced by markup that would run if it were ever parsed as HTML."""
    lines = []
    for n, line in enumerate(path.read_text().splitlines()):
        rec = json.loads(line)
        if isinstance(rec.get("tokens"), dict):
            rec["tokens"] = {k: HOSTILE[int(k) % len(HOSTILE)] + v for k, v in rec["tokens"].items()}
        if rec["kind"] == "header":
            rec["config"]["acceptance"] = HOSTILE[0]
            rec["config"]["target_model"] = HOSTILE[1]
            rec["models"] = {"target": HOSTILE[2]}
        if rec["kind"] == "step":
            for e in rec["kv"]["events"]:
                e["op"] = HOSTILE[1]
        if rec["kind"] == "summary":
            for r in rec["requests"]:
                r["prompt_text"] = HOSTILE[0] + r["prompt_text"]
        lines.append(json.dumps(rec, ensure_ascii=False))
    out.write_text("\n".join(lines) + "\n")
    return out


def test_a_hostile_trace_runs_nothing_and_shows_its_text_as_text(browser, traces, tmp_path):
    from selenium.webdriver.common.keys import Keys

    path = hostile_copy(traces("eagle"), tmp_path / "hostile.jsonl")
    html = open_page(browser, path, tmp_path).read_text()
    data = html.split('id="trace-data">')[1].split("</script>")[0]
    assert html.count("</script>") == 2 and "<" not in data and "onerror" in data  # there, but inert
    press(browser, Keys.ARROW_RIGHT, 8)  # through the drafting, the verdict and the KV events
    for tok in browser.find_elements("css selector", "#text .tok")[:6]:
        browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}))", tok)
    assert browser.execute_script("return window.__pwned === undefined")
    assert not browser.find_elements("css selector", "#text img, #text script, #text b, #tree img, #summary img")
    text = browser.find_element("id", "text").text
    assert "</script><script>window.__pwned = 1</script>" in text and "onerror" in text
    assert HOSTILE[0] in browser.find_element("id", "meta").text
    assert console_errors(browser) == []


def test_a_batch_trace_has_a_request_picker(browser, traces, tmp_path):
    from selenium.webdriver.support.ui import Select

    path = traces("batch")
    trace = open_trace(path)
    open_page(browser, path, tmp_path)
    picker = Select(browser.find_element("id", "request"))
    assert [o.text for o in picker.options] == ["request 0", "request 1", "request 2"]
    picker.select_by_visible_text("request 2")
    spans = browser.find_elements("css selector", "#text .tok")
    assert [" ".join(c for c in s.get_attribute("class").split() if c not in ("tok", "current")) for s in spans] \
        == token_classes(trace, 2)
    first = next(i for i, m in enumerate(trace.index) if m.request == 2)
    assert browser.find_element("id", "step-label").text.startswith(f"step {trace.step(first)['step']} ")
    assert console_errors(browser) == []


@pytest.mark.parametrize("name", [n for n in RUNS if n not in ("eagle", "batch")])
def test_every_algorithm_and_rule_opens_and_walks(browser, traces, tmp_path, name):
    from selenium.webdriver.common.keys import Keys

    path = traces(name)
    trace = open_trace(path)
    open_page(browser, path, tmp_path)
    algo = trace.header["config"]["algo"]
    first = trace.step(0)
    phases = panels.phases_of(first, algo)
    press(browser, Keys.ARROW_RIGHT, phases.index("ACCEPT"))
    assert browser.find_element("id", "phases").get_attribute("data-current") == "ACCEPT"
    nodes = step_tree(first, trace.token_text)
    assert len(browser.find_elements("css selector", "#tree g.node")) == len(nodes)
    assert len(browser.find_elements("css selector", "#text .tok")) == len(token_classes(trace, 0))
    press(browser, Keys.END)
    assert console_errors(browser) == []


def test_a_rejudged_trace_says_so_on_its_page(tmp_path):
    trace, judged = tmp_path / "t.jsonl", tmp_path / "j.jsonl"
    assert main(["run", "--no-tui", "--algo", "eagle", "--max-new-tokens", "6", "--record-probs", "--trace",
                 str(trace)]) == 0
    assert main(["rejudge", str(trace), "--acceptance", "target_only", "--temperature", "1", "-o", str(judged)]) == 0
    data = report_data(TraceFile(judged))
    assert any(n.startswith(f"re-judged from {trace}") for n in data["notices"])
    assert len(data["steps"]) == len(TraceFile(judged))
