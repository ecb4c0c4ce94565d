"""The split backbone reproduces the unsplit model, keeps both caches consistent through crops, and
rejects configurations it cannot run exactly."""

import pytest
import torch
import transformers
from _tiny import random_lora
from transformers import LlamaConfig, LlamaForCausalLM

from mtpc.lm.backbone import LlamaFamily, SplitBackbone


def tiny_llama(vocab=40, hidden=32, layers=3, seed=0, dtype=torch.float64, config_cls=LlamaConfig, **extra):
    torch.manual_seed(seed)
    config = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **extra)
    return LlamaForCausalLM(config).to(dtype).eval() if config_cls is LlamaConfig else \
        transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()




def run_in_chunks(backbone, ids, chunks):
    """Feed `ids` `[1, T]` in pieces; returns logits and hidden `[1, T, .]`."""
    state, logits, hidden, start = backbone.new_state(), [], [], 0
    for size in chunks:
        out = backbone(ids[:, start:start + size], state)
        logits.append(out.logits)
        hidden.append(out.hidden)
        start += size
    assert state.length == ids.shape[1]
    return torch.cat(logits, 1), torch.cat(hidden, 1)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_split_reproduces_unsplit_logits(k):
    model = tiny_llama()
    ids = torch.randint(0, 40, (1, 12), generator=torch.Generator().manual_seed(0))
    expected = model(ids).logits  # [1, 12, V]
    logits, hidden = run_in_chunks(SplitBackbone(model, lora_layers=k), ids, [5, 1, 4, 2])
    torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-10)
    # without adapters the draft path computes the same function as the verifier
    torch.testing.assert_close(model.lm_head(hidden), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("k", [1, 2])
def test_split_with_lora_verifier_is_base_and_draft_is_adapted(k):
    model = tiny_llama(layers=3)
    ids = torch.randint(0, 40, (1, 10), generator=torch.Generator().manual_seed(1))
    base_logits = model(ids).logits
    peft_model = random_lora(model, k)
    adapted_logits = peft_model(input_ids=ids).logits
    assert (adapted_logits - base_logits).abs().max() > 1e-2  # the adapters really change the model
    logits, hidden = run_in_chunks(SplitBackbone(peft_model, lora_layers=k), ids, [4, 3, 3])
    torch.testing.assert_close(logits, base_logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(model.lm_head(hidden), adapted_logits, rtol=1e-10, atol=1e-10)
    # the adapters are enabled again after the verifier pass
    torch.testing.assert_close(peft_model(input_ids=ids).logits, adapted_logits)


@pytest.mark.parametrize("k", [0, 2])
def test_caches_stay_consistent_across_accept_and_reject(k):
    """Speculative-style use: feed a window, keep a random prefix of it, crop, continue. The final
    outputs must equal a fresh pass over the committed sequence, on both paths."""
    model = tiny_llama(layers=3)
    peft_model = random_lora(model, k) if k else model
    backbone = SplitBackbone(peft_model, lora_layers=k)
    gen = torch.Generator().manual_seed(2)
    committed = torch.randint(0, 40, (1, 5), generator=gen)
    state = backbone.new_state()
    backbone(committed, state)
    for _ in range(8):
        window = torch.randint(0, 40, (1, 4), generator=gen)
        backbone(window, state)
        keep = int(torch.randint(1, 5, (1,), generator=gen))
        backbone.crop(state, committed.shape[1] + keep)
        committed = torch.cat([committed, window[:, :keep]], 1)
    probe = torch.randint(0, 40, (1, 3), generator=gen)
    out = backbone(probe, state)
    full = torch.cat([committed, probe], 1)
    fresh_logits, fresh_hidden = run_in_chunks(SplitBackbone(peft_model, lora_layers=k), full, [full.shape[1]])
    torch.testing.assert_close(out.logits, fresh_logits[:, -3:], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out.hidden, fresh_hidden[:, -3:], rtol=1e-9, atol=1e-9)
    assert state.verifier.get_seq_length() == full.shape[1]
    if k:
        assert state.draft.get_seq_length(backbone.shared_layers) == full.shape[1]


def test_keep_returns_only_the_last_positions():
    model = tiny_llama()
    backbone = SplitBackbone(model)
    ids = torch.randint(0, 40, (1, 7), generator=torch.Generator().manual_seed(3))
    out = backbone(ids, backbone.new_state(), keep=1)
    assert out.logits.shape == (1, 1, 40) and out.hidden.shape == (1, 1, 32)
    torch.testing.assert_close(out.logits, model(ids).logits[:, -1:], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("config_cls", ["MistralConfig", "Qwen2Config", "Qwen3Config"])
def test_other_llama_layout_families(config_cls):
    extra = {"sliding_window": None} if config_cls == "MistralConfig" else {}
    model = tiny_llama(config_cls=getattr(transformers, config_cls), **extra)
    ids = torch.randint(0, 40, (1, 9), generator=torch.Generator().manual_seed(4))
    logits, _ = run_in_chunks(SplitBackbone(model, lora_layers=1), ids, [6, 3])
    torch.testing.assert_close(logits, model(ids).logits, rtol=1e-10, atol=1e-10)


def test_errors_are_helpful():
    model = tiny_llama(layers=2)
    with pytest.raises(ValueError, match="larger than the model's 2 decoder layers"):
        SplitBackbone(model, lora_layers=3)
    with pytest.raises(ValueError, match="integer >= 0"):
        SplitBackbone(model, lora_layers=-1)
    peft_model = random_lora(model, 2)
    with pytest.raises(ValueError, match=r"adapters on layer\(s\) \[0, 1\].*use lora_layers=2"):
        SplitBackbone(peft_model, lora_layers=0)
    with pytest.raises(ValueError, match=r"adapters on layer\(s\) \[0\].*use lora_layers=2"):
        SplitBackbone(peft_model, lora_layers=1)
    backbone = SplitBackbone(peft_model, lora_layers=2)
    with pytest.raises(ValueError, match="cannot crop"):
        backbone.crop(backbone.new_state(), 1)


def test_non_lora_adapters_are_refused():
    from peft import IA3Config, get_peft_model

    ia3 = get_peft_model(tiny_llama(layers=2), IA3Config(target_modules=["k_proj", "down_proj"],
                                                         feedforward_modules=["down_proj"]))
    with pytest.raises(ValueError, match="only LoRA adapters"):
        SplitBackbone(ia3, lora_layers=2)


def test_families_without_an_adapter_run_whole_but_not_split():
    opt = transformers.OPTForCausalLM(transformers.OPTConfig(vocab_size=40, hidden_size=32, ffn_dim=64,
                                                             num_hidden_layers=2, num_attention_heads=2,
                                                             word_embed_proj_dim=32)).double().eval()
    ids = torch.randint(0, 40, (1, 9), generator=torch.Generator().manual_seed(5))
    logits, _ = run_in_chunks(SplitBackbone(opt), ids, [5, 4])
    torch.testing.assert_close(logits, opt(ids).logits, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="no split-backbone adapter for model_type 'opt'.*lora_layers=1"):
        SplitBackbone(opt, lora_layers=1)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=2))
    with pytest.raises(ValueError, match="does not have the layout"):
        SplitBackbone(gpt2, lora_layers=1, family=LlamaFamily())


def test_attaching_and_loading_the_draft_lora_warns_nothing(tmp_path):
    """peft probing a deprecated transformers attribute printed a FutureWarning on every `mtpc train
    --lora-layers` and every bench or generate of a LoRA head; nothing of it may reach the user."""
    import warnings

    from mtpc.lm.lora import attach_draft_lora
    from mtpc.lm.lora import load_lora

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attach_draft_lora(tiny_llama(), 1, rank=2).save_pretrained(tmp_path / "lora")
        load_lora(tiny_llama(), tmp_path / "lora")
    assert [str(w.message) for w in caught] == []
