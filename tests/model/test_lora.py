"""LoRA: adapter + fully trained offset table, a standard PEFT directory, merged loads and merge_lora.py."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from rpt.model import RPTForCausalLM
from rpt.model.lora import add_lora, save_lora_checkpoint
from rpt.model.objective import make_rpt_batch
from rpt.model.wrapper import RPT_TABLE_NAME
from rpt.training.config_keys import check_lora_section
from tests.helpers.inprocess_train import train_main
from tests.helpers.scripts import ROOT, load_script
from tests.helpers.tiny_models import tiny_gpt2, tiny_llama
from tests.helpers.train_helpers import run_train, write_config

peft = pytest.importorskip("peft")

SECTION = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def lora_model(base, section=SECTION, seed=0):
    model = RPTForCausalLM.from_base(base, window=3)
    counts = add_lora(model, section)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # as if trained: a non-zero adapter (lora_B starts at 0) and table
        for name, p in model.named_parameters():
            if "lora_B" in name or "offset_embedding" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval(), counts


def inputs():
    x = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(4))
    b = make_rpt_batch(x, window=3, s=1.0, q=0.4, generator=torch.Generator().manual_seed(4))
    return x, b.input_ids, dict(position_ids=b.position_ids, offset_ids=b.offset_ids)


def test_only_adapter_and_table_train():
    model, counts = lora_model(tiny_llama())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n == "offset_embedding.weight" for n in trainable)
    # hand count: q_proj 32->32 and v_proj 32->16 (2 KV heads of 8), r = 4, 2 layers; table 4 x 32
    assert counts["adapter"] == 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4) and counts["table"] == 4 * 32
    assert counts["trainable"] == counts["adapter"] + counts["table"]


@pytest.mark.parametrize("builder,section", [
    (tiny_llama, SECTION),
    (tiny_gpt2, {"r": 2, "alpha": 4, "target_modules": ["c_attn"]}),  # tied embeddings, Conv1D layers
    (tiny_llama, {"r": 2}),  # all-linear
])
def test_adapter_directory_round_trip_and_merge(tmp_path, builder, section):
    model, _ = lora_model(builder(), section)
    x, ids, kw = inputs()
    with torch.no_grad():
        ntp, ptp = model(x).logits, model(ids, **kw).logits  # the unmerged adapter: the truth
    save_lora_checkpoint(model, str(tmp_path / "lora"), section, base=None)
    saved = json.loads((tmp_path / "lora" / "rpt_config.json").read_text())
    assert saved["lora"]["base"] == "base" and os.path.isfile(tmp_path / "lora" / "adapter_config.json")
    with torch.no_grad():
        # a standard PEFT directory: PeftModel loads it on the base (unmerged), plus the table
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "lora" / "base")
        peft_model = peft.PeftModel.from_pretrained(base, tmp_path / "lora").eval()
        assert (RPTForCausalLM.attach_table(peft_model, tmp_path / "lora")(ids, **kw).logits - ptp).abs().max() < 1e-5
        loaded = RPTForCausalLM.from_pretrained(tmp_path / "lora")  # merged
        assert (loaded(ids, **kw).logits - ptp).abs().max() < 1e-4
        assert load_script("merge_lora.py").main([str(tmp_path / "lora"), str(tmp_path / "merged")]) == 0
        merged = RPTForCausalLM.from_pretrained(tmp_path / "merged")
        assert (merged(ids, **kw).logits - ptp).abs().max() < 1e-4
        plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")  # faithful: plain HF = RPT NTP
        assert (plain(x).logits - ntp).abs().max() < 1e-4


def test_from_pretrained_loads_an_adapter_without_importing_rpt_lora(tmp_path):
    """rpt.model does not import rpt.model.lora (it sits above it); from_pretrained's registered loader
    still loads an adapter directory in a process that imported only rpt.model."""
    model, _ = lora_model(tiny_llama())
    x, ids, kw = inputs()
    with torch.no_grad():
        truth = model(ids, **kw).logits
    save_lora_checkpoint(model, str(tmp_path / "lora"), SECTION, base=None)
    torch.save({"ids": ids, **kw}, tmp_path / "inputs.pt")
    code = ("import sys, torch\nfrom rpt.model import RPTForCausalLM\nassert 'rpt.model.lora' not in sys.modules\n"
            f"d = torch.load({str(tmp_path / 'inputs.pt')!r})\nids = d.pop('ids')\n"
            f"m = RPTForCausalLM.from_pretrained({str(tmp_path / 'lora')!r})\n"
            f"assert m.merged_from_lora\nwith torch.no_grad():\n    torch.save(m(ids, **d).logits, {str(tmp_path / 'out.pt')!r})\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (torch.load(tmp_path / "out.pt") - truth).abs().max() < 1e-4


@pytest.mark.parametrize("section,match", [
    ({"rank": 4}, "unknown key 'rank'"), ({"r": 0}, "r must be"), ({"dropout": 1.5}, "dropout"),
    ({"target_modules": []}, "target_modules"), ("yes", "mapping"),
])
def test_bad_lora_section_names_the_problem(section, match):
    assert match in check_lora_section(section)


def test_merge_of_a_full_checkpoint_is_one_clear_error(tmp_path, capsys):
    RPTForCausalLM.from_base(tiny_llama(), window=2).save_pretrained(tmp_path / "full")
    assert load_script("merge_lora.py").main([str(tmp_path / "full"), str(tmp_path / "out")]) == 2
    assert "not a LoRA checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_train_with_lora_then_sample_and_merge(tmp_path, capsys):
    cfg = write_config(tmp_path, lora=SECTION, max_steps=6, save_every=3, eval_every=3)
    assert train_main(cfg) == 0  # in this process: LoRA training, not the process boundary, is under test
    assert "LoRA: training 1,024 of 38,816 parameters (2.64%): adapter 896 + offset table 128" in capsys.readouterr().out
    final = tmp_path / "run" / "final"
    assert {"adapter_config.json", "adapter_model.safetensors", "rpt_config.json"} <= set(os.listdir(final))
    assert (final / RPT_TABLE_NAME).is_file()
    sample = load_script("sample.py")
    code = sample.main(["--checkpoint", str(final), "--prompt", "def add(a,", "--max-new-tokens", "8",
                        "--rpt-iters", "1", "--rpt-window", "3"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.strip() and "stats: 8 new tokens" in out.err  # the streamed completion, then the stats
    assert load_script("merge_lora.py").main([str(final), str(tmp_path / "merged")]) == 0
    x = torch.randint(0, 300, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = RPTForCausalLM.from_pretrained(final)(x).logits
        b = RPTForCausalLM.from_pretrained(tmp_path / "merged")(x).logits
        c = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")(x).logits
    assert (a - b).abs().max() < 1e-4 and (a - c).abs().max() < 1e-4


def adapter_tensors(final):
    from safetensors.torch import load_file

    return load_file(str(final / "adapter_model.safetensors")), load_file(str(final / RPT_TABLE_NAME))


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["ddp", "zero2", "zero3"])
def test_lora_under_ddp_and_deepspeed(tmp_path, launch):
    """DDP (2 processes) equals 1 process with 2 accumulation steps; ZeRO-2/3 (1 CPU process:
    accelerate forms DeepSpeed groups only on GPUs) save non-empty, trained adapter tensors."""
    from tests.helpers.train_helpers import ROOT, accelerate_cmd, free_port, run_cmd, zero_launch_config

    over = dict(lora=SECTION, max_steps=3, save_every=100, eval_batches=0, micro_batch_size=2)
    if launch == "ddp":
        cfg = write_config(tmp_path, **over)
        single = run_train(cfg, f"output_dir={tmp_path / 'single'}", "grad_accum=2")
        assert single.returncode == 0, single.stderr[-3000:]
        launch_file = os.path.join(ROOT, "configs/accelerate/cpu_ddp.yaml")
    else:
        cfg = write_config(tmp_path, precision="bf16", **over)
        launch_file = zero_launch_config(tmp_path, int(launch[-1]))
    res = run_cmd(accelerate_cmd(launch_file, free_port(), cfg,
                                 f"output_dir={tmp_path / 'dist'}"))
    assert res.returncode == 0, res.stderr[-3000:]
    adapter, table = adapter_tensors(tmp_path / "dist" / "final")
    assert adapter and all(v.numel() > 0 for v in adapter.values())
    assert all(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # trained away from zero
    assert table["offset_embedding.weight"].abs().sum() > 0
    if launch == "ddp":
        ref, ref_table = adapter_tensors(tmp_path / "single" / "final")
        for k in ref:
            assert torch.allclose(adapter[k], ref[k], rtol=1e-4, atol=1e-6), k
        assert torch.allclose(table["offset_embedding.weight"], ref_table["offset_embedding.weight"], atol=1e-6)
    RPTForCausalLM.from_pretrained(tmp_path / "dist" / "final")  # loads (merged)


def test_adapter_on_a_faithful_rpt_checkpoint(tmp_path):
    """LoRA from an RPT checkpoint (init_from): its base is folded, its table relative; the adapter's
    saved table is relative to that base, so loading gives the trained model back."""
    start = RPTForCausalLM.from_base(tiny_llama(tie_word_embeddings=True), window=3)
    with torch.no_grad():
        start.offset_embedding.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
    start.save_pretrained(tmp_path / "rpt")
    model = RPTForCausalLM.from_pretrained(tmp_path / "rpt", retie=False)  # as train.py loads a LoRA base
    add_lora(model, SECTION)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "offset_embedding" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    x, ids, kw = inputs()
    with torch.no_grad():
        ntp, ptp = model.eval()(x).logits, model(ids, **kw).logits
        save_lora_checkpoint(model, str(tmp_path / "lora"), SECTION, base=str(tmp_path / "rpt"))
        assert not (tmp_path / "lora" / "base").exists()  # the base is referred to, not copied
        loaded = RPTForCausalLM.from_pretrained(tmp_path / "lora")
        assert (loaded(ids, **kw).logits - ptp).abs().max() < 1e-4 and (loaded(x).logits - ntp).abs().max() < 1e-4


@pytest.mark.parametrize("adapter, expect", [("runs/no_such_run/final", "does not exist"),
                                             ("no_such_lora_run", "hub model id")])
def test_merge_of_a_missing_adapter_is_one_clear_error(tmp_path, capsys, monkeypatch, adapter, expect):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert load_script("merge_lora.py").main([adapter, str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and expect in err, err
    assert "Repo id must be" not in err and not (tmp_path / "out").exists()
