"""`spectrace bench`: the batch-scaling lab's numbers are the runs' own, and batching changes no
verdict (fp32 greedy), so τ at every batch is the τ of the same requests run alone."""
import torch

from spectrace.measure import bench
from spectrace.measure.bench import algos_table, batch_table, shape_table
from spectrace.measure.hf import hf_table
from spectrace.cli import main
from spectrace.run import RunConfig, run
from spectrace.zoo.prompts import HELD_OUT_PROMPTS


def test_batch_lab_tau_equals_the_requests_run_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # its traces go to runs/bench/

    def config(**kw):
        return RunConfig(max_new_tokens=12, **kw)
    prompts = HELD_OUT_PROMPTS[:3]
    table = batch_table(config, ["eagle"], prompts, [1, 3], repeat=1)
    alone = [run(config(algo="eagle", prompts=[p], trace=str(tmp_path / f"{i}.jsonl"))).metrics
             for i, p in enumerate(prompts)]
    tau_alone = sum(m["completion_tokens"] for m in alone) / sum(m["verify_ct"] for m in alone)
    assert table[1]["eagle"][1] == table[3]["eagle"][1] == tau_alone  # batch 1 runs each prompt alone
    assert table[3]["none"][1] is None
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["batch", "none", "tok/s"]
    for line, bs in zip(out[1:], (1, 3)):  # the printed speed-up is eagle's tokens/s over none's
        cells = line.replace("|", " ").split()
        none_tps, eagle_tps, tau, speed_up = float(cells[1]), float(cells[2]), float(cells[3]), cells[4]
        assert int(cells[0]) == bs and tau == round(table[bs]["eagle"][1], 3)
        assert speed_up == f"{table[bs]['eagle'][0] / table[bs]['none'][0]:.2f}x"
        assert (none_tps, eagle_tps) == (round(table[bs]["none"][0], 1), round(table[bs]["eagle"][0], 1))


def test_bench_refuses_bad_numbers_in_one_line(capsys):
    for args, message in ((["--repeat", "0"], "--repeat must be at least 1"),
                          (["--batch-sizes", "0"], "--batch-sizes must each be at least 1, not 0")):
        assert main(["bench", "--algos", "none", "--max-new-tokens", "2", *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err


def test_compare_hf_paths_give_spectrace_none_its_tokens(tmp_path, monkeypatch, capsys):
    """transformers' greedy generate is the reference: spectrace's plain and speculative decoding
    give its tokens (fp32), and so do its own static-cache loop, assisted and prompt-lookup paths."""
    monkeypatch.chdir(tmp_path)

    def config(**kw):
        return RunConfig(max_new_tokens=10, **kw)
    prompts = HELD_OUT_PROMPTS[:2]
    status = []  # the status line's messages: prompts x paths, cleared before each row
    hf = hf_table(config, prompts, repeat=1, progress=status.append)
    ours = algos_table(config, ["none", "eagle"], prompts, repeat=1, progress=status.append)
    paths = ["hf generate", "hf static cache", "hf assisted", "hf assisted k=4", "hf prompt lookup", "none", "eagle"]
    assert status == [m for p in paths for m in (f"bench: {p}, prompt 1 of 2", f"bench: {p}, prompt 2 of 2", None)]
    assert set(hf) == {"hf generate", "hf static cache", "hf assisted", "hf assisted k=4", "hf prompt lookup"}
    assert all(len(out) == 10 for out in hf["hf generate"])
    for outs in [*hf.values(), *ours.values()]:
        assert outs == hf["hf generate"]
    out = capsys.readouterr().out
    assert "same tokens as hf generate: 2 of 2" in out
    decode = {line[:20].strip(): line[20:33].strip() for line in out.splitlines() if line.startswith("hf ")}
    assert float(decode.pop("hf static cache")) > 0  # its loop's ms a token, the prompt's forward not counted
    assert set(decode.values()) == {"-"}
    # eagle's row: the textbook model from its own columns, and the realised speed-up from tokens/s
    none_row = next(line for line in out.splitlines() if line.startswith("none ")).split()
    row = next(line for line in out.splitlines() if line.startswith("eagle ")).split()
    tps, tau, r, predicted, step_model, realised = (float(row[2]), float(row[3]), float(row[9]), row[10], row[11],
                                                    row[12])
    assert abs(float(predicted.rstrip("x")) - tau / (1 + r)) < 0.011
    assert abs(float(realised.rstrip("x")) - tps / float(none_row[2])) < 0.011
    c_ar, c_step = float(none_row[7]) + float(none_row[8]), sum(float(c) for c in row[6:9])
    assert abs(float(step_model.rstrip("x")) - tau * c_ar / c_step) < 0.02  # τ C_AR / C_step
    assert abs(r - float(row[6]) / float(row[7])) < 0.002  # r = draft ms / verify ms


def test_the_static_cache_loop_decodes_as_generate_does_without_autograd():
    """measure/hf.py's StaticDecoder (transformers' fastest path, gpt-fast's loop): generate's greedy
    tokens, every forward with autograd off as generate's are. With it on, the K/V each forward
    writes into the StaticCache in place carry their autograd history (IndexCopyBackward), which
    keeps every forward's activations alive: at Llama-3.1-8B's shape that ran out of memory."""
    from transformers import AutoModelForCausalLM

    from spectrace.measure.hf import StaticDecoder
    from spectrace.zoo import TARGET_DIR

    model = AutoModelForCausalLM.from_pretrained(TARGET_DIR).eval()
    grad_on = []
    model.register_forward_hook(lambda *_: grad_on.append(torch.is_grad_enabled()))
    ids = torch.tensor([[5, 17, 300, 42, 9]])
    want = model.generate(ids, do_sample=False, max_new_tokens=6, pad_token_id=0)[0, 5:].tolist()
    grad_on.clear()
    decoder = StaticDecoder(model, 11, compiled=False)
    assert decoder.generate(ids, 6, set()) == want
    assert len(grad_on) == 6 and not any(grad_on)
    assert len(decoder.decode_ms) == 1 and decoder.decode_ms[0] > 0  # the call's ms a token after the prompt


def test_shape_lab_predicts_from_its_own_costs(tmp_path, monkeypatch, capsys):
    """--target-shape: each batch's prediction is τ·C_AR / (C_draft + C_verify + C_extend) from
    the costs it prints, τ measured on the embedded eagle3; the table says it is a prediction."""
    monkeypatch.chdir(tmp_path)

    def config(**kw):
        return RunConfig(**{"max_new_tokens": 8, **kw})
    table = shape_table(config, "embedded", [1, 2], repeat=1, kv_len=32)
    out = capsys.readouterr().out
    assert out.startswith("predicted, not measured end to end") and "(5,4,8)" in out
    for bs, c in table.items():
        assert f"tau {c['tau']:.3f} of the embedded eagle3" in out
        assert min(c["c_ar"], c["c_draft"], c["c_verify"], c["c_extend"]) > 0
        assert c["predicted"] == c["tau"] * c["c_ar"] / (c["c_draft"] + c["c_verify"] + c["c_extend"])
    costs = []  # the forwards each batch prices, as (head?, rows, features): a fake cost of their own

    def cost(model, kv_len, bs, rows, repeat, features=0):
        costs.append((features > 0, rows, features))
        return 1 + rows / 100 + features / 1e5
    for backend, fake in (("explicit", "forward_ms"), ("fast", "fast_forward_ms")):
        monkeypatch.setattr(bench, fake, cost)
        costs.clear()
        c = shape_table(lambda **kw: config(backend=backend, **kw), "embedded", [1], repeat=1, kv_len=32, tau=2.6)[1]
        H = 256  # the embedded target's width: a head's own state; the captured layers' features are 3H
        extend_rows = 6 if backend == "fast" else 3  # the fast engine pads accept_tokens to S + 1; else τ rounded
        assert sorted(costs) == sorted([(False, 1, 0), (True, 4, H), (False, 8, 0), (True, extend_rows, 3 * H)])
        # a step of (5, 4, 8): four draft forwards of K rows (level 0 is the last extend's q), one verify, one extend
        assert c["c_draft"] == 4 * cost(None, 0, 1, 4, 1, H) and c["c_extend"] == cost(None, 0, 1, extend_rows, 1, 3 * H)
    assert main(["bench", "--target-shape", "llama-9", "--batch-sizes", "1"]) == 2
    assert "unknown --target-shape 'llama-9'" in capsys.readouterr().err
    for profile in ([], ["--profile"]):
        assert main(["bench", "--target-shape", "embedded", "--backend", "fast", *profile]) == 2
        assert "add --device cuda" in capsys.readouterr().err


def test_the_roofline_groups_kernels_and_counts_the_span_once():
    """measure/roofline.py: kernels into groups by name, a group's rate over its own time, the gaps
    the union of the kernels' spans leaves (overlapping kernels, as programmatic dependent launch
    makes them, counted once), and every streamed byte over the span."""
    from spectrace.measure.roofline import roofline_rows

    kernels = [("_gemv_kernel", 0.0, 10.0), ("_add_rms_norm_kernel", 9.0, 12.0),  # overlaps the GEMV by 1
               ("_rows_kernel", 12.0, 14.0), ("nvjet_tst_64x8_splitK_TNT", 14.0, 24.0),  # rows_linear's, cuBLAS's
               ("_fwd_kernel", 24.0, 26.0), ("_merge_splits_kernel", 26.0, 27.0),
               ("index_select_kernel", 30.0, 31.0)]  # after a gap of 3
    rows = {r["group"]: r for r in roofline_rows(kernels, {"linear": 40e6, "attention": 3e6})}
    assert (rows["linear"]["kernels"], rows["linear"]["us"], rows["linear"]["tb_s"]) == (3, 22.0, 40e6 / 22.0 / 1e6)
    assert (rows["attention"]["kernels"], rows["attention"]["us"], rows["attention"]["tb_s"]) == (2, 3.0, 1.0)
    assert rows["norm"]["us"] == 3.0 and rows["other"]["kernels"] == 1 and rows["norm"]["tb_s"] is None
    assert rows["gaps"]["us"] == 3.0
    assert (rows["span"]["us"], rows["span"]["bytes"], rows["span"]["tb_s"]) == (31.0, 43e6, 43e6 / 31.0 / 1e6)


def test_a_draft_level_streams_every_weight_of_the_head_but_fc(drafters):
    """measure/roofline.py: streamed_bytes: a level fed the head's own state reads no fc; its KV is the
    head's one layer."""
    from spectrace.measure.roofline import streamed_bytes

    head = drafters["eagle3"]
    cfg, size = head.config, next(head.parameters()).element_size()
    every = streamed_bytes(head, 2, 10)
    level = streamed_bytes(head, 2, 10, unread=(head.fc,))
    assert every["linear"] - level["linear"] == head.fc.weight.numel() * size
    assert level["attention"] == every["attention"] == 2 * 2 * 10 * cfg.num_key_value_heads * cfg.head_dim * size


def test_the_grown_pair_is_measured_beside_the_prediction(tmp_path, monkeypatch, capsys):
    """--target-shape small: the grown pair (spectrace/zoo/grow) is made once under runs/grown/,
    its target's decode timed beside the random one's, then run end to end: eagle3's realised
    speed-up is its tokens/s over none's, set beside the step model at the run's own τ."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("def add(a, b):\n")
    args = ["bench", "--target-shape", "small", "--batch-sizes", "1", "--repeat", "1", "--max-new-tokens", "8",
            "--prompts", "p.txt"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "growing the embedded target, eagle3 to the small shape" in out and "C_AR grown" in out
    lines = out.splitlines()
    lab = lines[lines.index(next(x for x in lines if x.startswith("measured end to end"))) + 2].replace("|", " ").split()
    none_tps, eagle3_tps, tau = float(lab[1]), float(lab[2]), float(lab[3])
    realised = lines[-1].split()  # batch, tau, predicted, decoding, of predicted, end to end
    assert realised[0] == "1" and float(realised[1]) == tau
    assert abs(float(realised[5].rstrip("x")) - eagle3_tps / none_tps) < 0.011
    decoding, model = float(realised[3][:-1]), float(realised[2][:-1])  # printed to 2 decimals: ±0.005 each
    assert abs(float(realised[4].rstrip("%")) / 100 - decoding / model) <= 0.005 * (1 + decoding / model) / model + 5e-4
    assert main(args) == 0 and "growing" not in capsys.readouterr().out  # made once
    assert main([*args, "--random-weights"]) == 0
    assert "measured end to end: the grown pair" not in capsys.readouterr().out
    assert main(["bench", "--random-weights"]) == 2 and "add --target-shape" in capsys.readouterr().err


def test_drafting_slower_than_plain_on_the_embedded_pair_on_a_gpu_says_why(capsys):
    bench.launch_bound_note(lambda **kw: RunConfig(device="cuda", **kw), {"eagle3": (0.94, 3.16), "eagle": (1.2, 3.0)},
                            HELD_OUT_PROMPTS)
    out = capsys.readouterr().out
    assert out.startswith("note: eagle3 runs 0.94x plain decoding here") and "launch-bound" in out
    assert "--target-shape llama-3.1-8b" in out and "eagle " not in out
    bench.launch_bound_note(lambda **kw: RunConfig(device="cpu", **kw), {"eagle3": (0.94, 3.16)}, HELD_OUT_PROMPTS)
    assert capsys.readouterr().out == ""
