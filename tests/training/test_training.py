import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from rpt.model import RPTForCausalLM
from rpt.training.config import ConfigError, load_config
from rpt.training.measure.metrics import read_metrics
from tests.helpers.inprocess_train import one_error_line, train_main
from tests.helpers.train_helpers import (
    MICRO,
    ROOT,
    accelerate_cmd,
    env,
    free_port,
    run_cmd,
    run_train,
    train_cmd,
    write_config,
)


def losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(os.path.join(run_dir, "metrics.jsonl"))}


def test_train_end_to_end_writes_everything(tmp_path):
    # tied embeddings, as the demo's configs: final/ must untie them to be faithful (rpt.checkpoint.folded_weights)
    cfg = write_config(tmp_path, plot=True, model={**MICRO["model"], "tie_word_embeddings": True})
    assert train_main(cfg) == 0
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 11))
    for key in ("loss", "ntp_loss", "ptp_loss_1", "ptp_loss_2", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_mb"):
        assert key in rows[-1], key
    evals = [r for r in rows if "eval_ntp_loss" in r]
    assert [r["step"] for r in evals] == [5, 10]
    assert evals[-1]["eval_ntp_loss"] < evals[0]["eval_ntp_loss"]
    assert evals[-1]["eval_ptp_loss_1"] is not None
    # the latest evaluation's per-batch sums add up to its logged means (intervals over batches)
    per_batch = json.loads((tmp_path / "run" / "eval_batches.json").read_text())
    assert per_batch["step"] == 10 and per_batch["batch"] == sorted(set(per_batch["batch"]))
    sums, counts = (torch.tensor(per_batch[k], dtype=torch.float64) for k in ("sum", "count"))
    for kind, key in enumerate(("eval_ntp_loss", "eval_ptp_loss_1", "eval_ptp_loss_2")):
        assert float(sums[:, kind].sum() / counts[:, kind].sum()) == pytest.approx(evals[-1][key], rel=1e-9)
    assert rows[-1]["loss"] < rows[0]["loss"]
    # keep_last=2 checkpoints, final/ loadable with its tokenizer, the loss plot
    assert {"checkpoint-10", "checkpoint-5", "config.yaml", "final", "eval_batches.json"} <= set(os.listdir(run))
    model = RPTForCausalLM.from_pretrained(run / "final")
    assert model.window == 3
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run / "final")
    assert tok.eos_token is not None
    # the trained checkpoint is faithful: plain transformers computes the RPT model's NTP logits
    from transformers import AutoModelForCausalLM

    x = torch.randint(0, len(tok), (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(run / "final").eval()(x).logits
        assert (plain - model.eval()(x).logits).abs().max() <= 1e-4
    assert json.loads((run / "final" / "rpt_config.json").read_text())["untied_embeddings"] is True
    assert (run / "loss_curves.png").stat().st_size > 1000
    assert not [n for n in os.listdir(run) if n.endswith(".tmp")]


# the text variant is slow-marked (20 s): the default suite kills and resumes the token-store run
@pytest.mark.multiprocess
@pytest.mark.parametrize("data", [pytest.param("text", marks=pytest.mark.slow), "tokens"])
def test_killed_run_resumes_exactly(tmp_path, data, capsys):
    """Text data (a token store prepared on the fly) and a store named directly ({tokens: DIR},
    written by prepare_data.py): SIGKILL after checkpoint-20, resume, the same losses. The killed run is
    a process of its own; the reference and the resume run in this one."""
    cfg = write_config(tmp_path, max_steps=40, save_every=20, log_every=1, seed=7, eval_every=100, eval_batches=0)
    if data == "tokens":
        import prepare_data

        assert prepare_data.main(["--config", cfg, "--out", str(tmp_path / "store"), "--num-proc", "1"]) == 0
        cfg = write_config(tmp_path, max_steps=40, save_every=20, log_every=1, seed=7, eval_every=100, eval_batches=0,
                           data={"tokens": str(tmp_path / "store")}, tokenizer=None)
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    assert train_main(cfg, f"output_dir={ref_dir}") == 0

    proc = subprocess.Popen(train_cmd(cfg, f"output_dir={cut_dir}"), env=env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (cut_dir / "checkpoint-20" / "trainer_state.json").exists():
        assert proc.poll() is None, "training ended before checkpoint-20 appeared"
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (cut_dir / "final").exists()

    capsys.readouterr()
    assert train_main(cfg, f"output_dir={cut_dir}", "resume=auto") == 0
    assert "resumed from" in capsys.readouterr().out
    a, b = losses(ref_dir), losses(cut_dir)
    assert sorted(b) == list(range(1, 41))  # rows a killed run logged past step 20 were dropped
    for step in range(21, 41):
        assert abs(a[step] - b[step]) <= 1e-5 * abs(a[step]), (step, a[step], b[step])


@pytest.mark.multiprocess
def test_two_process_ddp_matches_single_process(tmp_path):
    pytest.importorskip("accelerate")
    # 3 validation batches on 2 ranks: one rank runs a padding forward
    cfg = write_config(tmp_path, max_steps=4, save_every=100, eval_batches=3, eval_every=4, micro_batch_size=2)
    assert train_main(cfg, f"output_dir={tmp_path / 'single'}", "grad_accum=2") == 0
    ddp = run_cmd(accelerate_cmd(os.path.join(ROOT, "configs/accelerate/cpu_ddp.yaml"), free_port(), cfg,
                                 f"output_dir={tmp_path / 'ddp'}"), timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "Setting accelerator to CPU" not in ddp.stdout + ddp.stderr  # deepspeed not imported without DeepSpeed
    replicas = json.loads((tmp_path / "ddp" / "replicas.json").read_text())
    assert replicas["world_size"] == 2
    fp = replicas["parameter_fingerprints"]
    assert fp[0] == pytest.approx(fp[1], rel=0, abs=0)  # bitwise the same after DDP steps
    a, b = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-4)
    # evaluation split over the ranks: the same batches, each once, the same sums
    one, two = (json.loads((tmp_path / name / "eval_batches.json").read_text()) for name in ("single", "ddp"))
    assert one["batch"] == two["batch"] == [0, 1, 2]
    assert torch.tensor(two["sum"]) == pytest.approx(torch.tensor(one["sum"]), rel=1e-4)
    assert two["count"] == one["count"]


def test_ntp_objective_equals_base_model_labels_loss(tmp_path):
    from rpt.training.step import forward, make_batch
    from tests.helpers.tiny_models import tiny_llama

    cfg = load_config(write_config(tmp_path, objective="ntp"))
    base = tiny_llama(vocab_size=300)
    model = RPTForCausalLM.from_base(base, window=3)
    rows = torch.randint(0, 300, (4, cfg.seq_len + 1))
    with torch.no_grad():
        ours = forward(model, make_batch(cfg, rows, step=1, micro_index=0)).loss
        ref = base(rows, labels=rows).loss
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)


def test_config_overrides_and_base_inheritance(tmp_path):
    base = write_config(tmp_path)
    child = tmp_path / "child.yaml"
    child.write_text(yaml.safe_dump({"base": "config.yaml", "lr": 1e-4, "objective": "ntp"}))
    cfg = load_config(str(child), ["max_steps=7", "model.hidden_size=64", "q=0.5"])
    assert load_config(str(child), ["lr=1e-3"]).lr == 1e-3  # YAML 1.1 reads 1e-3 as a string
    assert cfg.lr == 1e-4 and cfg.objective == "ntp" and cfg.max_steps == 7 and cfg.q == 0.5
    assert cfg.model["hidden_size"] == 64 and cfg.model["num_hidden_layers"] == 2
    assert load_config(base).max_steps == 10


@pytest.mark.parametrize(
    "override, match",
    [
        ("learning_rate=1e-3", "unknown config key 'learning_rate'"),
        ("window=1", "'window'"),
        ("s=1.5", "'s'"),
        ("q=-0.1", "'q'"),
        ("objective=mlm", "'objective'"),
        ("max_steps=ten", "'max_steps' must be int"),
        ("precision=fp8", "'precision'"),
        ("report_to=mlflow", "'report_to'"),
        ("seq_len=2", "'seq_len'"),
        ("resume=/no/such/dir", "'resume'"),
        ("lora.rank=4", "'lora'.*unknown key 'rank'"),
        ("lora=8", "'lora'.*use a mapping"),
    ],
)
def test_bad_config_values_name_the_key(tmp_path, override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write_config(tmp_path), [override])


def test_bad_config_stops_with_one_clear_line(tmp_path):
    res = run_train(write_config(tmp_path), "lerning_rate=3")
    assert res.returncode == 2
    lines = [line for line in res.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: unknown config key 'lerning_rate'")
    missing = run_train(str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_every_rank_runs_the_same_number_of_eval_forwards():
    from rpt.training.validation import eval_assignment

    for n_batches in (0, 1, 2, 3, 5, 16):
        for world in (1, 2, 3, 8):
            plans = [eval_assignment(n_batches, world, r) for r in range(world)]
            assert len({len(p) for p in plans}) == 1, (n_batches, world)  # no rank waits in a collective
            real = sorted(b for p in plans for b in p if b is not None)
            assert real == list(range(n_batches))  # every batch exactly once


def test_flops_per_token_and_device_peaks(monkeypatch):
    from rpt.training.measure.metrics import device_peak_flops, flops_per_token
    from tests.helpers.tiny_models import tiny_llama

    model = RPTForCausalLM.from_base(tiny_llama(vocab_size=97), window=3)
    # By hand: per layer q, o (32x32), k, v (32x16: 2 KV heads of 8), MLP 3 x 32x64, 2 norms (32);
    # final norm 32; the untied head 97x32. The input embedding and the offset table are lookups.
    per_layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32
    n = 2 * per_layer + 32 + 97 * 32
    assert flops_per_token(model, seq_len=50) == 6 * n + 12 * 2 * 32 * 50
    assert device_peak_flops(torch.device("cpu"), "bf16") is None
    assert device_peak_flops(torch.device("cpu"), "bf16", override_tflops=100) == 100e12
    for name, precision, peak in (("NVIDIA A100-SXM4-80GB", "bf16", 312e12), ("NVIDIA A10G", "bf16", None), ("NVIDIA A10", "bf16", 125e12),
                                  ("NVIDIA H100 PCIe", "bf16", 756e12), ("NVIDIA H100 80GB HBM3", "fp32", 67e12),
                                  ("NVIDIA L40S", "bf16", 362e12), ("Some Future GPU", "bf16", None)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, n=name: n)
        assert device_peak_flops(torch.device("cuda"), precision) == peak, name


@pytest.mark.parametrize("bad, match", [
    ({"data": [{"path": "a.jsonl"}, {"tokens": "dir"}]}, "token store"),
    ({"data": {"path": "a.jsonl", "hub": "x"}}, "exactly one"),
    ({"data": [{"path": "a.jsonl", "weight": 0}]}, "weight"),
    ({"val_data": "corpus.jsonl"}, "val_data"),
    ({"data_workers": -1}, "data_workers"),
    ({"peak_tflops": 0}, "peak_tflops"),
])
def test_bad_data_config_names_the_key(tmp_path, bad, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write_config(tmp_path, **bad))


def test_recipe_validates_on_documents_training_never_sees():
    from rpt.data import split_sources

    cfg = load_config(os.path.join(ROOT, "configs/llama3_8b_rpt.yaml"))
    assert cfg.val_data is None and 0 < cfg.val_fraction <= 0.01
    # both splits read the same streams, on opposite sides of the text-hash split
    assert split_sources(cfg, "train") == (cfg.data, "train")
    assert split_sources(cfg, "validation") == (cfg.data, "validation")
    assert all(s["streaming"] for s in cfg.data)


def test_flops_per_token_of_a_qwen3_shape_counts_heads_times_head_dim():
    """Qwen3-0.6B's shape (hidden 1024, 16 heads of 128, 8 KV heads, 28 layers, MLP 3072, tied
    151936-token head), built on the meta device: 6 N + 12 L (16 x 128) T with N counted by hand."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rpt.training.measure.metrics import flops_per_token

    shape = dict(hidden_size=1024, num_attention_heads=16, head_dim=128, num_key_value_heads=8, num_hidden_layers=28,
                 intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True)
    with torch.device("meta"):
        model = RPTForCausalLM.from_base(AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **shape)), window=3)
    h, a, kv, m, layers, v = 1024, 16 * 128, 8 * 128, 3072, 28, 151936
    per_layer = h * a + 2 * h * kv + a * h + 3 * h * m + 2 * h + 2 * 128  # q, k, v, o, MLP, 2 norms, q/k norms
    n = layers * per_layer + h + v * h  # final norm; the tied head counts once, as a matmul
    T = 4096
    expected = 6 * n + 12 * layers * a * T
    assert flops_per_token(model, T) == pytest.approx(expected, rel=0.01)
    assert flops_per_token(model, T) == pytest.approx(expected, rel=1e-9)  # by hand, exactly


def test_warmup_longer_than_the_run_is_shortened_and_train_log_has_a_line_per_logged_step(tmp_path, capsys):
    cfg = write_config(tmp_path, warmup_steps=30, max_steps=6, log_every=2, eval_every=3, save_every=100)
    capsys.readouterr()
    assert train_main(cfg) == 0
    stdout = capsys.readouterr().out
    assert "warmup_steps 30 is longer than the run (max_steps 6): warming up over all 6 steps" in stdout
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    # warmup over all 6 steps: the rate of step t (1-based) is lr * t / 6, the peak at the last step
    assert {r["step"]: r["lr"] for r in rows if "lr" in r} == pytest.approx({t: 3e-3 * t / 6 for t in (2, 4, 6)})
    assert yaml.safe_load((run / "config.yaml").read_text())["warmup_steps"] == 6
    log = (run / "train.log").read_text()
    assert "\r" not in log
    step_lines = log.splitlines()  # one line per metrics row: logged steps 2, 4, 6 and the evaluation at 3
    assert [line.split()[:2] for line in step_lines] == [["step", f"{r['step']}/6"] for r in rows]
    assert [("| eval" in line) for line in step_lines] == ["eval_ntp_loss" in r for r in rows]
    assert f"loss {rows[0]['loss']:.4f}" in step_lines[0]
    # the start-up block: parameters counted independently on the saved model, tokens per step, start
    summary = (run / "run_summary.txt").read_text()
    total = sum(p.numel() for p in RPTForCausalLM.from_pretrained(run / "final").parameters())
    assert f"parameters: {total:,} total, {total:,} trainable" in summary
    assert f"tokens per step: {MICRO['micro_batch_size'] * MICRO['seq_len']:,} " in summary
    assert "device: cpu x 1 process" in summary and "precision fp32" in summary and "start: step 0" in summary
    assert summary.strip() in stdout and stdout.index("parameters:") < stdout.index("step 2/6")


def _train_main(capsys, *argv):
    from tests.helpers.scripts import load_script

    code = load_script("train.py").main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_inputs_checked_before_any_work_each_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # configs/tiny_finetune.yaml's init_from (runs/tiny_pretrain/final) is not here
    msg = _train_main(capsys, "--config", os.path.join(ROOT, "configs/tiny_finetune.yaml"))
    assert "'init_from'" in msg and "runs/tiny_pretrain/final" in msg and "configs/tiny_pretrain.yaml" in msg
    cfg = write_config(tmp_path)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        (["model=not-a-model-rpt-test"], ["'model'", "hub model id", "not in the local hub cache", "hf download"]),
        (["model=rpt-test-org/none", "tokenizer=null"], ["no local directory", "hub model id"]),
        ([f"tokenizer={tmp_path / 'no_tok'}"], ["'tokenizer'", "does not exist"]),
        ([f"output_dir={a_file}"], ["'output_dir'", "is a file"]),
        ([f"output_dir={a_file / 'run'}"], ["'output_dir'", "cannot be created", "is a file"]),
        ([f"cache_dir={a_file}"], ["'cache_dir'", "is a file"]),
    ]
    from accelerate.utils import is_tensorboard_available, is_wandb_available

    cases += [([f"report_to={name}"], ["'report_to'", f"pip install {name}"])
              for name, there in (("tensorboard", is_tensorboard_available()), ("wandb", is_wandb_available()))
              if not there]
    for overrides, expect in cases:
        msg = _train_main(capsys, "--config", cfg, *overrides)
        assert all(e in msg for e in expect), (overrides, msg)
    assert sorted(os.listdir(tmp_path)) == ["a_file", "config.yaml"]  # no run directory, cache or tokenizer


def test_devices_flags_and_config_files_that_cannot_work_are_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """Devices this machine lacks, model directories that hold no model or tokenizer, config files that are
    not UTF-8, repeat a key or are directories, unknown flags: one error line, exit 2, nothing written."""
    for name in ("ACCELERATE_TORCH_DEVICE", "RPT_BREAK_RUN_LOCK"):  # train.py sets them for the run: restored after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    cfg = write_config(inputs, output_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"))
    checkpoint = inputs / "checkpoint-4"  # a training checkpoint: state, not a model
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text("{}")
    no_tokenizer = inputs / "model"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text("{}")
    (inputs / "latin1.yaml").write_bytes("seq_len: 32\n# caf\xe9\n".encode("latin-1"))
    (inputs / "twice.yaml").write_text(open(cfg).read() + "lr: 0.1\nlr: 0.2\n")
    cases = [
        (["--device", "meta"], ["--device 'meta' is not a device to run a model on"]), (["--device", "tpu9"], ["'tpu9' is not a device"]),
        ([f"init_from={checkpoint}"], ["'init_from'", "training checkpoint", "final/"]),
        ([f"init_from={no_tokenizer}", "tokenizer=null"], ["'init_from'", "holds no tokenizer"]),
    ]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], ["no cuda device"]))
    for argv, expect in cases:
        msg = _train_main(capsys, "--config", cfg, *argv)
        assert all(e in msg for e in expect), (argv, msg)
        os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
    for config, expect in ((inputs / "latin1.yaml", "line 2 is not UTF-8"), (inputs / "twice.yaml", "'lr' appears twice"),
                           (inputs, "is a directory")):
        assert expect in _train_main(capsys, "--config", config)
    with pytest.raises(SystemExit) as exit_:
        _train_main(capsys, "--config", cfg, "--devcie", "cpu")
    assert exit_.value.code == 2 and one_error_line(capsys.readouterr().err).endswith("--devcie (see train.py --help)")
    assert sorted(os.listdir(tmp_path)) == ["inputs"]  # no run directory, cache or tokenizer


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_output_dir_is_one_line(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    msg = _train_main(capsys, "--config", write_config(tmp_path), f"output_dir={locked / 'run'}")
    assert "not writable" in msg


def test_help_loads_neither_torch_nor_transformers():
    code = ("import sys, runpy; sys.argv = ['train.py', '--help']\ntry:\n    runpy.run_path('train.py', run_name='__main__')\n"
            "except SystemExit:\n    pass\nprint(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]" and "train.log" in res.stdout


def test_optional_backends_are_imported_only_where_used():
    """deepspeed (its import prints "Setting accelerator to CPU"), peft and lm_eval load only in
    the runs that use them; the trainer, the sampler and the evaluation scripts do not import them."""
    code = ("import sys\nimport rpt.training.loop, rpt.sampling.loading, rpt.evaluation.benchmark_script, rpt.hf_generate, rpt.model.lora\n"
            "from rpt.training.setup import make_accelerator\nfrom rpt.training.config import TrainConfig\n"
            "import torch\nmake_accelerator(TrainConfig(output_dir='unused')).unwrap_model(torch.nn.Linear(1, 1))\n"
            "print(sorted(m for m in ('deepspeed', 'peft', 'lm_eval') if m in sys.modules))")
    e = {k: v for k, v in env().items() if k != "ACCELERATE_USE_DEEPSPEED"}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]"


def test_train_log_is_cut_back_to_the_resumed_checkpoint(tmp_path):
    """As metrics.jsonl: a killed run's lines past its checkpoint go, a new run starts empty."""
    from rpt.training.run_dir.log import RunLog, step_line

    def lines_of(max_steps):
        return [step_line({"step": s, "loss": 1.0 / s}, max_steps) for s in range(1, max_steps + 1)]

    (tmp_path / "train.log").write_text("".join(line + "\n" for line in lines_of(30)))
    log = RunLog(str(tmp_path), enabled=True, resume_step=20)
    log.write(step_line({"step": 21, "loss": 0.5}, 30))
    kept = (tmp_path / "train.log").read_text().splitlines()
    assert kept == lines_of(30)[:20] + [step_line({"step": 21, "loss": 0.5}, 30)]
    RunLog(str(tmp_path), enabled=True, resume_step=0)
    assert (tmp_path / "train.log").read_text() == ""
