"""The command line on the tiny decoder-only translators (HY-MT, Qwen3, TranslateGemma): translate from arguments,
stdin, files and documents (each paragraph one prompt), the exact prompt (--show-prompt, as transformers renders
it), a glossary and a context (HY-MT's prompts; refused elsewhere in one line), validate against transformers,
quantize then translate, eval on FLORES, tune."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from onnxmt import Translator
from onnxmt.cli import app
from onnxmt.manifest import DECODER_FILE
from onnxmt.runtime.options import RuntimeOptions
from tests.helpers.skips import importorskip, shared_data

runner = CliRunner()
TEXTS = ["The river was quiet. The market was not open yet.", "Good?", "A small fast model."]
SHORT = ["--max-new-tokens", "8"]
PAIR = ["--source-lang", "en", "--target-lang", "zh"]
# HY-MT's model card: the terminology template, and the Chinese request that follows it.
TERMS = "参考下面的翻译：\nriver 翻译成 江\n\n将以下文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释：\n"


def _translator(directory: Path) -> Translator:
    return Translator(directory, RuntimeOptions(threads=1))


def _texts(translator: Translator, texts: list[str], **request: object) -> list[str]:
    return [
        t.text for t in translator.translate(texts, source_lang="en", target_lang="zh", max_new_tokens=8, **request)
    ]


def test_plain_text_from_arguments_stdin_and_files_is_one_prompt_a_line(hy_mt_onnx_dir: Path, tmp_path: Path) -> None:
    """A line of two sentences is one text for a paragraph-level model: its translation is the library's for the
    line whole, through arguments, stdin and -i/-o; --unit sentence cuts it."""
    expected = _texts(_translator(hy_mt_onnx_dir), TEXTS)
    base = ["translate", "-m", str(hy_mt_onnx_dir), *PAIR, *SHORT]
    arguments = runner.invoke(app, [*base, *TEXTS])
    piped = runner.invoke(app, base, input="\n".join(TEXTS) + "\n")
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    to_file = runner.invoke(app, [*base, "-i", str(source), "-o", str(tmp_path / "out.txt")])
    for result in (arguments, piped, to_file):
        assert result.exit_code == 0, result.output
    assert arguments.stdout.splitlines() == piped.stdout.splitlines() == expected
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == expected
    cut = runner.invoke(app, [*base, "--unit", "sentence", TEXTS[0]])
    sentences = _texts(_translator(hy_mt_onnx_dir), ["The river was quiet.", "The market was not open yet."])
    assert cut.exit_code == 0 and cut.stdout.rstrip("\n") != expected[0], cut.output
    assert all(s in cut.stdout for s in sentences)


def test_html_and_docx_documents_give_each_paragraph_whole(hy_mt_onnx_dir: Path, tmp_path: Path) -> None:
    translator = _translator(hy_mt_onnx_dir)
    page = f"<html><body><h1>{TEXTS[1]}</h1><p>{TEXTS[0]}</p></body></html>"
    (tmp_path / "in.html").write_text(page, encoding="utf-8")
    base = ["translate", "-m", str(hy_mt_onnx_dir), *PAIR, *SHORT]
    result = runner.invoke(app, [*base, "-i", str(tmp_path / "in.html"), "-o", str(tmp_path / "out.html")])
    assert result.exit_code == 0, result.output
    written = (tmp_path / "out.html").read_text(encoding="utf-8")
    heading, paragraph = _texts(translator, [TEXTS[1], TEXTS[0]])
    assert f"<h1>{html.escape(heading, quote=False)}</h1>" in written
    assert f"<p>{html.escape(paragraph, quote=False)}</p>" in written
    importorskip("docx")
    from tests.helpers.office import docx_structure, make_docx

    make_docx(tmp_path / "in.docx")
    result = runner.invoke(app, [*base, "-i", str(tmp_path / "in.docx"), "-o", str(tmp_path / "out.docx")])
    assert result.exit_code == 0, result.output
    assert docx_structure(tmp_path / "out.docx") == docx_structure(tmp_path / "in.docx")


def test_show_prompt_prints_transformers_prompt(hy_mt_onnx_dir: Path, hy_mt_hf_dir: Path) -> None:
    """--show-prompt prints each text's whole prompt and its ids: the ids transformers' apply_chat_template gives
    for the model card's request, with and without a glossary."""
    importorskip("transformers")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hy_mt_hf_dir))

    def transformers_ids(user: str) -> list[int]:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"])

    base = ["translate", "-m", str(hy_mt_onnx_dir), *PAIR, "--show-prompt"]
    shown = runner.invoke(app, [*base, "Good?"])
    assert shown.exit_code == 0, shown.output
    user = "将以下文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释：\n\nGood?"
    assert user in shown.stdout and str(transformers_ids(user)) in shown.stdout
    french = runner.invoke(app, [*base[:-3], "--target-lang", "fr", "--show-prompt", "Good?"])
    assert "Translate the following segment into French, without additional explanation.\n\nGood?" in french.stdout


def test_a_glossary_and_a_context_reach_hy_mts_prompts(
    hy_mt_onnx_dir: Path, translategemma_onnx_dir: Path, tmp_path: Path
) -> None:
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("river\t江\nmountain\t山\n\n", encoding="utf-8")
    base = ["translate", "-m", str(hy_mt_onnx_dir), *PAIR]
    shown = runner.invoke(app, [*base, "--glossary", str(glossary), "--show-prompt", TEXTS[0], TEXTS[1]])
    assert shown.exit_code == 0, shown.output
    assert TERMS + TEXTS[0] in shown.stdout  # only the term the text holds
    assert "山" not in shown.stdout and "参考下面的翻译" not in shown.stdout.split("--- text 2")[1]
    translated = runner.invoke(app, [*base, *SHORT, "--glossary", str(glossary), TEXTS[0]])
    want = _texts(_translator(hy_mt_onnx_dir), [TEXTS[0]], glossary=[("river", "江")])
    assert translated.exit_code == 0 and translated.stdout.splitlines() == want, translated.output
    context = runner.invoke(app, [*base, "--context", "A story about a town.", "--show-prompt", "Good?"])
    assert (
        "A story about a town.\n参考上面的信息，把下面的文本翻译成中文，注意不需要翻译上文，也不要额外解释：\nGood?"
        in context.stdout
    )
    for args in (
        ["-m", str(translategemma_onnx_dir), *PAIR, "--glossary", str(glossary), "x"],
        ["-m", str(hy_mt_onnx_dir), *PAIR, "--glossary", str(glossary), "--context", "c", "x"],
    ):
        refused = runner.invoke(app, ["translate", *args])
        assert refused.exit_code == 2 and "Traceback" not in refused.output
        assert len(refused.output.strip().splitlines()) == 1, refused.output
    inspected = runner.invoke(app, ["inspect", str(hy_mt_onnx_dir)], env={"COLUMNS": "200"})
    assert "参考下面的翻译" in inspected.output and "参考上面的信息" in inspected.output  # the templates, shown
    assert re.search(r"unit of text\W+paragraph", inspected.output), inspected.output
    inspected = runner.invoke(app, ["inspect", str(translategemma_onnx_dir)], env={"COLUMNS": "200"})
    assert "(refused: no terminology prompt)" in inspected.output
    glossary.write_text("river only\n", encoding="utf-8")
    bad = runner.invoke(app, [*base, "--glossary", str(glossary), "x"])
    assert bad.exit_code == 2 and "line 1: not a 'source<TAB>target' pair" in bad.output


@pytest.mark.parametrize(("family", "target"), [("hy_mt", "zh"), ("qwen3", "zh"), ("translategemma", "de")])
def test_validate_against_transformers(request: pytest.FixtureRequest, family: str, target: str, tmp_path: Path):
    """generate(do_sample=False) on transformers' own prompt ids, greedy and beam 2: identical, ids included."""
    importorskip("torch")
    onnx_dir = request.getfixturevalue(f"{family}_onnx_dir")
    hf_dir = request.getfixturevalue(f"{family}_hf_dir")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    args = ["validate", str(onnx_dir), "-r", str(hf_dir), "-i", str(corpus), "--beams", "2", *SHORT]
    result = runner.invoke(
        app, [*args, "--source-lang", "en", "--target-lang", target, "--report", str(tmp_path / "r")]
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert report["tokenizer_identical"] == report["greedy_identical"] == report["beam_identical"] == 3
    assert report["max_abs_logit_diff"] < 1e-4
    assert any(len(s["greedy_reference"]) > 1 for s in report["per_sentence"])  # outputs, not only an eos


def _prompt_logits(directory: Path) -> np.ndarray:
    translator = _translator(directory)
    prompts = [list(p.ids) for p in translator.prepare(TEXTS, source_lang="en", target_lang="zh")]
    logits, _ = translator.graphs.prefill(prompts)  # type: ignore[attr-defined]
    return np.asarray(logits)


@pytest.mark.parametrize(
    ("form", "flags", "ops"),
    [
        ("int8", [], {"DynamicQuantizeMatMul", "MatMulInteger"}),
        ("per-row", ["--per-row-scales"], {"MatMulIntegerToFloat"}),
        ("int4", ["--int4"], {"MatMulNBits", "GatherBlockQuantized"}),
    ],
)
def test_quantize_then_translate(hy_mt_onnx_dir: Path, tmp_path: Path, form: str, flags: list[str], ops: set[str]):
    """The quantized decoder (its tied embedding and LM head, cut into chunks in these tests as a 120k-row head is,
    taken too) translates through the CLI with the chat prompt; its logits follow fp32's up to rounding; per-row int8
    gives a text the same tokens alone and batched."""
    from onnxmt.runtime.graphinfo import read_graph

    out = tmp_path / form
    result = runner.invoke(app, ["quantize", str(hy_mt_onnx_dir), str(out), *flags])
    assert result.exit_code == 0, result.output
    found = read_graph(out / DECODER_FILE).quantization()
    assert all(op in found for op in ops), found
    got, want = _prompt_logits(out), _prompt_logits(hy_mt_onnx_dir)
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > (0.9 if form == "int4" else 0.99)
    translated = runner.invoke(app, ["translate", "-m", str(out), *PAIR, *SHORT, *TEXTS])
    assert translated.exit_code == 0, translated.output
    translator = _translator(out)
    assert translated.stdout.splitlines() == _texts(translator, TEXTS)
    if form == "per-row":
        alone = [_texts(translator, [text])[0] for text in TEXTS]
        assert alone == translated.stdout.splitlines()
    refused = runner.invoke(app, ["quantize", str(hy_mt_onnx_dir), str(tmp_path / "enc"), "--parts", "encoder"])
    assert refused.exit_code == 2 and "no encoder graph" in refused.output


def test_eval_on_a_flores_slice_and_tune(hy_mt_onnx_dir: Path, hy_mt_hf_dir: Path, tmp_path: Path) -> None:
    """eval scores the library's translations; its PyTorch row (--reference) prompts and decodes as onnxmt does,
    so an fp32 export scores the same."""
    importorskip("torch")
    flores = shared_data("flores200")
    args = ["eval", str(hy_mt_onnx_dir), "--reference", str(hy_mt_hf_dir), "--src", str(flores / "devtest.eng_Latn")]
    args += ["--ref", str(flores / "devtest.zho_Hans"), *PAIR, "--limit", "3", "--latency-sentences", "1", *SHORT]
    result = runner.invoke(app, [*args, "--report", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval.json").read_text(encoding="utf-8"))
    onnx, pytorch = report["rows"]
    assert (pytorch["bleu"], pytorch["chrf"]) == (onnx["bleu"], onnx["chrf"])
    sources = (flores / "devtest.eng_Latn").read_text(encoding="utf-8").splitlines()[:3]
    references = (flores / "devtest.zho_Hans").read_text(encoding="utf-8").splitlines()[:3]
    hypotheses = _texts(_translator(hy_mt_onnx_dir), sources)  # the library's, each source under its chat prompt
    chrf = importorskip("sacrebleu").corpus_chrf(hypotheses, [references]).score
    assert report["rows"][0]["chrf"] == pytest.approx(chrf)
    tuned = runner.invoke(
        app, ["tune", "-m", str(hy_mt_onnx_dir), *PAIR, "--tokens", "2", "--rounds", "1", "--max-threads", "1"]
    )
    assert tuned.exit_code == 0 and "lowest latency" in tuned.output, tuned.output
