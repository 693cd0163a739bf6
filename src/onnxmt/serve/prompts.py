"""What a chat asks to translate: the source and target languages and the text, read from the prompts translation
apps send to "OpenAI-compatible" backends (docs/apis.md lists the forms read).

- an instruction naming the target, in a system message or at the head of the last user message: "Translate the
  following text from English to Chinese:", "Translate into French.", "You are a translator. Translate English
  into Japanese", "Translate the following source text to German, Output translation directly ...",
  "将以下文本翻译为中文", "翻译成英文"; language names in English or in the language itself (`langcodes`), or codes;
- the text: the last user message without its instruction; after "Source Text:" up to "Translated Text:" where
  the prompt marks it so (Immersive Translate, PDFMathTranslate); inside a ``` fence when the text is fenced;
- TranslateGemma's content parts, `{"type": "text", "source_lang_code": ..., "target_lang_code": ..., "text"}`.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

import langcodes

from .protocol import ApiError

MAX_NAME_WORDS = 3
VERB = re.compile(r"\btranslat(?:e|es|ed|ing)\b", re.IGNORECASE)
# After the verb, on its line: "to"/"into" + the target; "from" + the source, or a language name alone before
# "into" ("Translate English into Japanese"). A name is tried from its longest form (three words) down.
TO = re.compile(r"\b(?:in)?to\s+", re.IGNORECASE)
FROM = re.compile(r"\bfrom\s+", re.IGNORECASE)
CODE = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*")
REACH = 160  # characters after the verb where its languages are looked for
# Bounds on the work one message may cause (each name tried is a lookup): an instruction is among its first
# verbs, its target among the first "to"s after one.
MAX_VERBS = 8
MAX_TOS = 4
CHINESE = re.compile(r"(?:翻译|翻譯)(?:成|为|為|到)(?P<target>[^\s，,。.:：、]{1,8})")
CHINESE_FROM = re.compile(r"(?:从|從)(?P<source>[^\s，,。.:：、]{1,8}?)(?:翻译|翻譯)")
SOURCE_MARK = re.compile(r"^\s*source text\s*:\s*", re.IGNORECASE | re.MULTILINE)
END_MARK = re.compile(r"\n\s*(?:translated text|translation)\s*:\s*$", re.IGNORECASE)
FENCE = re.compile(r"^```[\w-]*\n(?P<text>.*?)\n```$", re.DOTALL)
WORD = re.compile(r"[\w()'-]+", re.UNICODE)
# Words after "into X" that are not part of X ("into Chinese without explanation").
STOP_WORDS = {"and", "without", "with", "only", "please", "language", "keep", "output", "the", "text"}
# Words that follow "to" in English and are also language codes (my: Burmese, it: Italian, an: Aragonese).
STOP_WORDS |= {"my", "it", "an", "a", "this", "that", "its", "your", "our", "their", "his", "her", "me", "us"}


@dataclass(frozen=True)
class Ask:
    """What a chat asks: the text to translate and its languages (None: not said)."""

    text: str
    source: str | None
    target: str | None


def language_code(name: str) -> str | None:
    """A language's code from its name (English, or the language's own: "Chinese", "中文", "Deutsch") or its code
    ("zh-CN", "pt_BR"); None when it names none."""
    name = name.strip().strip("\"'`*.,:;()[]")
    if not name:
        return None
    try:
        if CODE.fullmatch(name):
            tag = langcodes.standardize_tag(name.replace("_", "-"))
            if langcodes.Language.get(tag).is_valid():
                return tag
        return str(langcodes.find(name))
    except (LookupError, ValueError):
        return None


def _name_at(text: str) -> tuple[str, int] | None:
    """(the code, where its name ends) of the language named at the start of `text`: its longest leading run of up
    to three words that names one."""
    words: list[re.Match[str]] = []
    for match in WORD.finditer(text):
        if len(words) == MAX_NAME_WORDS or match.group().lower() in STOP_WORDS:
            break
        if text[words[-1].end() if words else 0 : match.start()].strip():
            break  # punctuation between words: the name has ended
        words.append(match)
    for n in range(len(words), 0, -1):
        code = language_code(text[words[0].start() : words[n - 1].end()])
        if code is not None:
            return code, words[n - 1].end()
    return None


def _english(text: str) -> tuple[str | None, str, int, int] | None:
    """(source, target, start, end) of the first "translate ... (from X) to/into Y" in `text`."""
    for verb in itertools.islice(VERB.finditer(text), MAX_VERBS):
        line_end = text.find("\n", verb.end())
        window = text[verb.end() : min(verb.end() + REACH, line_end if line_end != -1 else len(text))]
        for to in itertools.islice(TO.finditer(window), MAX_TOS):
            found = _name_at(window[to.end() :])
            if found is None:
                continue
            before = window[: to.start()]
            source = None
            after_from = FROM.search(before)
            if after_from is not None:
                named = _name_at(before[after_from.end() :])
                source = named[0] if named else None
            elif before.strip() and not CODE.fullmatch(before.strip()):  # a name alone, never a code ("it")
                source = language_code(before)
            return source, found[0], verb.start(), verb.end() + to.end() + found[1]
    return None


def instruction(text: str) -> tuple[str | None, str | None, tuple[int, int] | None]:
    """(source, target, the span of the instruction) read from `text`, each None when not said."""
    english = _english(text)
    if english is not None:
        source, target, start, end = english
        return source, target, _instruction_span(text, start, end)
    chinese = CHINESE.search(text)
    if chinese is not None:
        named = language_code(chinese["target"])
        if named is not None:
            found = CHINESE_FROM.search(text[: chinese.start() + 2])
            return (
                language_code(found["source"]) if found else None,
                named,
                _instruction_span(text, chinese.start(), chinese.end()),
            )
    return None, None, None


def _instruction_span(text: str, start: int, end: int) -> tuple[int, int]:
    """The instruction from the start of its line to the end of its sentence: up to the first ':' or a blank line,
    else to the end of the line."""
    start = text.rfind("\n", 0, start) + 1
    colon = min((i for i in (text.find(":", end), text.find("：", end)) if i != -1), default=-1)
    blank = text.find("\n\n", end)
    line = text.find("\n", end)
    stops = [i + 1 for i in (colon,) if i != -1] + [i for i in (blank, line) if i != -1]
    return start, min(stops) if stops else len(text)


def content_text(content: object, where: str) -> tuple[str, str | None, str | None]:
    """A message's text (parts joined), and TranslateGemma's source and target codes where its parts give them."""
    if isinstance(content, str):
        return content, None, None
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of parts")
    texts, source, target = [], None, None
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}.content[{i}] must be a text part ({{'type': 'text', 'text': ...}})")
        texts.append(part["text"])
        source = _code_field(part, "source_lang_code", where) or source
        target = _code_field(part, "target_lang_code", where) or target
    return "\n".join(texts), source, target


def _code_field(part: dict[str, Any], name: str, where: str) -> str | None:
    value = part.get(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"{where}.content: {name} must be a string")
    return value or None


def read_chat(messages: object) -> Ask:
    """The translation a chat asks for. ApiError 400 for messages of the wrong shape or without a user message."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of messages")
    source = target = None
    last_user: tuple[str, str | None, str | None] | None = None
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"{where} must be an object with a role")
        if message["role"] not in ("system", "developer", "user"):
            continue  # earlier answers (an assistant's content may be null) say nothing of this request
        text, part_source, part_target = content_text(message.get("content", ""), where)
        if message["role"] in ("system", "developer"):
            said_source, said_target, _ = instruction(text)
            source, target = said_source or source, said_target or target
        elif message["role"] == "user":
            last_user = (text, part_source, part_target)
    if last_user is None:
        raise ApiError(400, "messages has no user message: the text to translate is the last user message's")
    text, part_source, part_target = last_user
    said_source, said_target, span = instruction(text)
    if span is not None:  # the instruction is not part of the text, wherever it stands
        text = text[: span[0]] + text[span[1] :]
    return Ask(_unwrap(text), part_source or said_source or source, part_target or said_target or target)


def _unwrap(text: str) -> str:
    """The text inside the prompt's marks: after "Source Text:", before "Translated Text:", inside a fence."""
    mark = SOURCE_MARK.search(text)
    if mark is not None:
        text = text[mark.end() :]
    text = END_MARK.sub("", text).strip("\n")
    fenced = FENCE.match(text.strip())
    return fenced["text"] if fenced else text.strip()
