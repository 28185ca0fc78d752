#!/usr/bin/env python3
"""test_tokenizer.py - the tokenizer tests: export_tokenizer.py + tokenizer.c against the Hugging Face
cases in test/fixtures/tokenizer (or $ZAYA_FIXTURES/tokenizer), run from the repo root:

    python3 test/test_tokenizer.py

It (1) builds the section with export_tokenizer.py from the fixture's tokenizer.json.gz and
tokenizer_config.json.gz into build/tokenizer_section.bin, (2) checks that export_tokenizer.py refuses
bad inputs with a ValueError (and follows checkpoint pointer files, reads .gz files, prefers plain ones),
(3) writes build/tokenizer_lossy.jsonl (invalid UTF-8 / random bytes with Python's lossy decode) and
build/tokenizer_english.txt (the repository's own Markdown prose, repeated to 1 MB),
(4) compiles and runs test/test_tokenizer.c (optimized, then under ASan/UBSan):
    cc -O2 -std=c11 -Wall -Wextra -Werror -pedantic -I. test/test_tokenizer.c tokenizer.c -o build/test_tokenizer
    build/test_tokenizer build/tokenizer_section.bin test/fixtures/tokenizer/cases.jsonl \
        build/tokenizer_lossy.jsonl build/tokenizer_english.txt
Output: one line per check, PASS <name> / FAIL <name>: <detail>; exit status 1 if anything failed.
Missing fixtures are a failure, never a skip.
"""
import base64
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import harness  # noqa: E402
from harness import check as report  # noqa: E402
TOK = os.path.join(harness.FIXTURES, "tokenizer")
BUILD = os.path.join(ROOT, "build")


def export_errors(model_dir):
    """export_tokenizer.py must raise ValueError (never another exception) on bad input."""
    import export_tokenizer as et
    with open(os.path.join(model_dir, "tokenizer.json"), "rb") as f:
        tj_raw = f.read()
    with open(os.path.join(model_dir, "tokenizer_config.json"), "rb") as f:
        cfg_raw = f.read()
    tj = json.loads(tj_raw)
    cfg = json.loads(cfg_raw)

    def variant(mut_tj=None, mut_cfg=None, raw_tj=None, raw_cfg=None):
        d = tempfile.mkdtemp(prefix="zaya_tok_", dir=BUILD)
        t2 = json.loads(json.dumps(tj)) if mut_tj else None
        c2 = json.loads(json.dumps(cfg)) if mut_cfg else None
        if mut_tj:
            mut_tj(t2)
        if mut_cfg:
            mut_cfg(c2)
        with open(os.path.join(d, "tokenizer.json"), "wb") as f:
            f.write(raw_tj if raw_tj is not None else json.dumps(t2).encode() if t2 is not None else tj_raw)
        with open(os.path.join(d, "tokenizer_config.json"), "wb") as f:
            f.write(raw_cfg if raw_cfg is not None else json.dumps(c2).encode() if c2 is not None else cfg_raw)
        return d

    def setk(path, value):
        def f(o):
            for k in path[:-1]:
                o = o[k]
            o[path[-1]] = value
        return f

    cases = [
        ("truncated JSON", dict(raw_tj=tj_raw[:1000])),
        ("not UTF-8", dict(raw_cfg=b'{"a": "\xff"}')),
        ("JSON array", dict(raw_tj=b"[1, 2]")),
        ("model.type WordPiece", dict(mut_tj=setk(["model", "type"], "WordPiece"))),
        ("byte_fallback false", dict(mut_tj=setk(["model", "byte_fallback"], False))),
        ("ignore_merges", dict(mut_tj=setk(["model", "ignore_merges"], True))),
        ("normalizer NFKC", dict(mut_tj=setk(["normalizer"], {"type": "NFKC"}))),
        ("Metaspace pre_tokenizer", dict(mut_tj=setk(["pre_tokenizer"], {"type": "Metaspace"}))),
        ("other decoder", dict(mut_tj=setk(["decoder"], {"type": "ByteLevel"}))),
        ("vocab not an object", dict(mut_tj=setk(["model", "vocab"], [1, 2]))),
        ("vocab id a string", dict(mut_tj=setk(["model", "vocab", "<bos>"], "2"))),
        ("merges not a list", dict(mut_tj=setk(["model", "merges"], 7))),
        ("merge of unknown piece", dict(mut_tj=lambda o: o["model"]["merges"].append(["zz\u00e9\u00e9q", "x"]))),
        ("merge wrong shape", dict(mut_tj=lambda o: o["model"]["merges"].insert(3, ["a", "b", "c"]))),
        ("lstrip added token", dict(mut_tj=lambda o: o["added_tokens"][5].update(lstrip=True))),
        ("added token without content", dict(mut_tj=lambda o: o["added_tokens"][5].pop("content"))),
        ("added token id wrong type", dict(mut_tj=lambda o: o["added_tokens"][5].update(id=None))),
        ("missing model", dict(mut_tj=lambda o: o.pop("model"))),
        ("bos_token unknown", dict(mut_cfg=setk(["bos_token"], "<nope>"))),
        ("add_bos_token not bool", dict(mut_cfg=setk(["add_bos_token"], "yes"))),
        ("chat_template unknown family", dict(mut_cfg=setk(["chat_template"], "{{ messages }}"))),
        ("chat_template missing", dict(mut_cfg=lambda o: o.pop("chat_template"))),
        ("chat_template wrong type", dict(mut_cfg=setk(["chat_template"], 5))),
    ]
    bad = []
    for name, kw in cases:
        d = variant(**kw)
        try:
            et.build_tokenizer_section(d)
            bad.append(f"{name}: accepted")
        except ValueError as e:
            msg = str(e)
            if "expected" not in msg and "hint" not in msg:
                bad.append(f"{name}: message without expected/hint: {msg[:100]!r}")
        except Exception as e:   # noqa: BLE001 - the point of the test
            bad.append(f"{name}: {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(d, ignore_errors=True)
    report(not bad, f"export_tokenizer.py refuses bad input with ValueError ({len(cases)} cases)", "; ".join(bad[:5]))

    # chat_format argument: forced formats, "none", and an unknown value
    probs = []
    for fmt in ("chatml", "none"):
        try:
            et.build_tokenizer_section(model_dir, fmt)
        except ValueError as e:
            probs.append(f"{fmt}: {e}")
    for fmt in ("gemma", "llama3", 5):     # gemma: this vocab has no <start_of_turn> token
        try:
            et.build_tokenizer_section(model_dir, fmt)
            probs.append(f"{fmt!r} accepted")
        except ValueError:
            pass
        except Exception as e:  # noqa: BLE001
            probs.append(f"{fmt!r}: {type(e).__name__}")
    d = tempfile.mkdtemp(prefix="zaya_tok_", dir=BUILD)
    try:
        et.build_tokenizer_section(d)
        probs.append("empty folder accepted")
    except ValueError:
        pass
    finally:
        shutil.rmtree(d, ignore_errors=True)
    report(not probs, "export_tokenizer.py chat_format argument (chatml, none; gemma/unknown refused)",
           "; ".join(probs))


def pointer_files(model_dir, ref):
    """a checkpoint folder whose tokenizer files are git symlinks checked out as text, and real symlinks"""
    import export_tokenizer as et
    d = tempfile.mkdtemp(prefix="zaya_tok_", dir=BUILD)
    try:
        sub = os.path.join(d, "ckpt")
        os.makedirs(sub)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            os.symlink(os.path.abspath(os.path.join(model_dir, name)), os.path.join(d, name))
            with open(os.path.join(sub, name), "w") as f:
                f.write(f"../{name}")
        a = et.build_tokenizer_section(sub)
        b = et.build_tokenizer_section(d)
        report(a == ref and b == ref, "export_tokenizer.py follows pointer files and symlinks",
               "section differs")
    except ValueError as e:
        report(False, "export_tokenizer.py follows pointer files and symlinks", str(e))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def gz_files(model_dir, ref):
    """tokenizer.json.gz / tokenizer_config.json.gz: read when the plain file is absent (also through a
    symlink or a pointer file), ignored when the plain file is there; a broken .gz is refused"""
    import gzip
    import export_tokenizer as et
    d = tempfile.mkdtemp(prefix="zaya_tok_", dir=BUILD)
    probs = []
    try:
        only, both, bad, ptr = (os.path.join(d, x) for x in ("only_gz", "both", "bad_gz", "pointer"))
        for sub in (only, both, bad, ptr):
            os.makedirs(sub)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(model_dir, name), "rb") as f:
                packed = gzip.compress(f.read(), mtime=0)
            with open(os.path.join(only, name + ".gz"), "wb") as f:
                f.write(packed)
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(both, name))
            with open(os.path.join(both, name + ".gz"), "wb") as f:     # another file: the plain one must win
                f.write(gzip.compress(b"{}"))
            with open(os.path.join(bad, name + ".gz"), "wb") as f:
                f.write(packed[:len(packed) // 2])
            with open(os.path.join(ptr, name + ".gz"), "w") as f:
                f.write(f"../only_gz/{name}.gz")
        for label, sub in (("only .gz", only), ("plain and .gz", both), ("pointer to .gz", ptr)):
            try:
                if et.build_tokenizer_section(sub) != ref:
                    probs.append(f"{label}: another section")
            except ValueError as e:
                probs.append(f"{label}: {e}")
        try:
            et.build_tokenizer_section(bad)
            probs.append("truncated .gz accepted")
        except ValueError as e:
            if "gzip" not in str(e):
                probs.append(f"truncated .gz: message without 'gzip': {str(e)[:100]!r}")
        except Exception as e:   # noqa: BLE001 - the point of the test
            probs.append(f"truncated .gz: {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    report(not probs, "export_tokenizer.py reads .gz tokenizer files when the plain ones are absent (plain ones win; "
           "a truncated .gz is refused)", "; ".join(probs))


def english_text(path, size=1000000):
    """An English text for the long round trip: the repository's Markdown files, repeated to `size` bytes;
    U+2581 is left out (the decoder turns it into a space by design)."""
    parts = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(x for x in dirs if x not in (".git", "build"))
        parts += [os.path.join(top, f) for f in sorted(files) if f.endswith(".md")]
    text = b""
    for p in parts:
        with open(p, "rb") as f:
            text += f.read().replace("\u2581".encode(), b"_") + b"\n"
    with open(path, "wb") as f:
        f.write((text * (size // max(len(text), 1) + 1))[:size].rsplit(b"\n", 1)[0] + b"\n")
    return path


def lossy_cases(path):
    rng = random.Random(1234)
    vectors = [b"\xe4\xb8a", b"\xff", b"\xfe\xff", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
               b"\xe2\x82\xac", b"\xf0\x9f\x98\x80\x80", b"a\x80\x80b", b"\xe0\x80\x80", b"\xf8\x88\x80\x80\x80",
               b"<bos\xff>", b"<bos>\xff<|im_end|>", b"\xc3", b"x\xc3", b"\xc3 y", b"\n\xe4\xb8\n\xad\n",
               b"\xed\xbf\xbf", b"\xf4\x8f\xbf\xbf", b"\x00\xff\x00", b"  \x80  "]
    for k in range(300):
        n = rng.randrange(0, 120)
        if k % 3 == 0:
            s = bytes(rng.randrange(256) for _ in range(n))
        elif k % 3 == 1:   # mostly text with a few bad bytes
            s = bytearray("The quick <|im_start|> \u4e2d\u6587 caf\u00e9 \U0001F600\n\n\t".encode() * (1 + n // 40))
            for _ in range(rng.randrange(1, 5)):
                s[rng.randrange(len(s))] = rng.randrange(128, 256)
            s = bytes(s)
        else:              # bytes from the UTF-8 building blocks
            s = bytes(rng.choice([0x41, 0x20, 0x0A, 0x3C, 0xC3, 0xA9, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80,
                                  0xED, 0xA0, 0xF4, 0x90, 0xBF]) for _ in range(n))
        vectors.append(s)
    with open(path, "w") as f:
        for k, raw in enumerate(vectors):
            exp = raw.decode("utf-8", "replace")
            if "\u2581" in exp:
                continue
            f.write(json.dumps({"name": f"lossy/{k}", "kind": "lossy", "text_b64": base64.b64encode(raw).decode(),
                                "expect_b64": base64.b64encode(exp.encode()).decode()}) + "\n")


# ---- a second, smaller tokenizer made from the fixture (a vocab with holes, fewer merges, another
# chat template) and a plain Python reference of the HF algorithm (README "Exact semantics"), so the
# C code is checked on a vocabulary it was not developed on

def mini_tokenizer(model_dir, out_dir, keep_below=12000):
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    vocab = {p: i for p, i in tj["model"]["vocab"].items() if i < keep_below}
    tj["model"]["vocab"] = vocab
    tj["model"]["merges"] = [m for m in tj["model"]["merges"] if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    tj["added_tokens"] = [a for a in tj["added_tokens"] if a["id"] < keep_below or a["content"] not in
                          tj_pieces_all(a, model_dir)]
    # a ChatML template without thinking, and <think> as a special token
    for a in tj["added_tokens"]:
        if a["content"] == "<think>":
            a["special"] = True
    cfg["chat_template"] = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + " \
                           "'<|im_end|>\\n' }}{% endfor %}"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False)
    return tj, cfg


def tj_pieces_all(a, model_dir):
    return () if a["id"] >= 262144 else (a["content"],)


class RefTokenizer:
    """The HF algorithm in plain Python: added tokens leftmost-longest, ' ' -> U+2581, BPE by repeatedly
    merging the leftmost lowest-rank pair, byte fallback, TemplateProcessing; decode with ByteFallback."""

    def __init__(self, tj, prefix, suffix):
        self.vocab = tj["model"]["vocab"]
        self.ranks = {}
        for r, (a, b) in enumerate(tj["model"]["merges"]):
            self.ranks[(a, b)] = r
        self.added = {a["content"]: a["id"] for a in tj["added_tokens"]}
        self.special = {a["content"] for a in tj["added_tokens"] if a["special"]}
        self.id2tok = {i: p for p, i in self.vocab.items()}
        self.id2tok.update({i: c for c, i in self.added.items()})
        self.maxlen = max(len(c) for c in self.added)
        self.prefix, self.suffix = prefix, suffix
        self.unk = self.vocab.get(tj["model"].get("unk_token"))

    def bpe(self, word):
        syms = []
        for ch in word.replace(" ", "\u2581"):
            if ch in self.vocab:
                syms.append(ch)
            elif all(f"<0x{b:02X}>" in self.vocab for b in ch.encode()):
                syms.extend(f"<0x{b:02X}>" for b in ch.encode())
            else:
                syms.append(None)   # unk (never in these texts)
        while True:
            best = None
            for k in range(len(syms) - 1):
                r = self.ranks.get((syms[k], syms[k + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, k)
            if best is None:
                break
            k = best[1]
            syms[k:k + 2] = [syms[k] + syms[k + 1]]
        return [self.vocab[s] if s is not None else self.unk for s in syms]

    def encode(self, text, add_special):
        ids, start, i = [], 0, 0
        while i < len(text):
            m = None
            for n in range(min(self.maxlen, len(text) - i), 0, -1):
                if text[i:i + n] in self.added:
                    m = n
                    break
            if m is None:
                i += 1
                continue
            if start < i:
                ids += self.bpe(text[start:i])
            ids.append(self.added[text[i:i + m]])
            i += m
            start = i
        if start < len(text):
            ids += self.bpe(text[start:])
        return (self.prefix + ids + self.suffix) if add_special else ids

    def decode(self, ids, skip):
        out, run = [], bytearray()

        def flush():
            if run:
                try:
                    out.append(run.decode("utf-8"))
                except UnicodeDecodeError:
                    out.append("\ufffd" * len(run))
                run.clear()
        for i in ids:
            t = self.id2tok.get(i)
            if t is None or (skip and t in self.special):
                continue
            t = t.replace("\u2581", " ")
            if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                run.append(int(t[3:5], 16))
                continue
            flush()
            out.append(t)
        flush()
        return "".join(out)


def other_vocab(model_dir, texts):
    import export_tokenizer as et
    d = os.path.join(BUILD, "tokenizer_mini")
    tj, cfg = mini_tokenizer(model_dir, d)
    try:
        sec = et.build_tokenizer_section(d)
    except ValueError as e:
        report(False, "export_tokenizer.py builds a smaller tokenizer with id holes", str(e))
        return None
    report(True, f"export_tokenizer.py builds a smaller tokenizer with id holes ({len(tj['model']['vocab'])} pieces, "
                 f"{len(tj['model']['merges'])} merges, chat format recognised)")
    sec_path = os.path.join(BUILD, "tokenizer_mini.bin")
    with open(sec_path, "wb") as f:
        f.write(sec)
    ref = RefTokenizer(tj, [2], [106])
    rng = random.Random(7)
    ids_all = sorted(ref.id2tok)
    cases_path = os.path.join(BUILD, "tokenizer_mini_cases.jsonl")
    with open(cases_path, "w") as f:
        for k, text in enumerate(texts):
            f.write(json.dumps({"name": f"mini/encode/{k}", "kind": "encode",
                                "text_b64": base64.b64encode(text.encode()).decode(),
                                "ids": ref.encode(text, True), "ids_no_special": ref.encode(text, False)}) + "\n")
        for k in range(300):
            ids = [rng.choice(ids_all) if rng.random() < 0.6 else rng.randrange(238, 494) if rng.random() < 0.8
                   else rng.randrange(-5, 270000) for _ in range(rng.randrange(0, 40))]
            f.write(json.dumps({"name": f"mini/decode/{k}", "kind": "decode", "ids": ids,
                                "text_b64": base64.b64encode(ref.decode(ids, False).encode()).decode(),
                                "text_skip_special_b64": base64.b64encode(ref.decode(ids, True).encode()).decode()})
                    + "\n")
    return sec_path, cases_path


def main():
    os.makedirs(BUILD, exist_ok=True)
    need = [os.path.join(TOK, "tokenizer.json.gz"), os.path.join(TOK, "tokenizer_config.json.gz"),
            os.path.join(TOK, "cases.jsonl")]
    missing = [p for p in need if not os.path.exists(p)]
    if missing:
        report(False, "tokenizer fixtures", f"missing {', '.join(missing)} (hint: they are part of the repository; "
               "restore them with `git checkout -- test/fixtures`)")
        return 1
    model_dir = harness.tokenizer_dir()      # the same files unpacked, for the tests that edit them
    import export_tokenizer
    section_path = os.path.join(BUILD, "tokenizer_section.bin")
    try:
        ref = export_tokenizer.build_tokenizer_section(TOK)
    except ValueError as e:
        report(False, "export_tokenizer.py builds the fixture section from its .gz files", str(e))
        return 1
    with open(section_path, "wb") as f:
        f.write(ref)
    report(True, f"export_tokenizer.py builds the fixture section from its .gz files ({len(ref) / 1e6:.1f} MB)")
    texts = []
    with open(os.path.join(TOK, "cases.jsonl")) as f:
        for line in f:
            c = json.loads(line)
            if c["kind"] == "encode":
                t = base64.b64decode(c["text_b64"]).decode()
                if len(t) <= 3000:
                    texts.append(t)
    mini = other_vocab(model_dir, texts)
    mini_dir = os.path.join(BUILD, "tokenizer_mini")
    if mini:
        export_errors(mini_dir)
        with open(mini[0], "rb") as f:
            sec = f.read()
        pointer_files(mini_dir, sec)
        gz_files(mini_dir, sec)
    lossy = os.path.join(BUILD, "tokenizer_lossy.jsonl")
    lossy_cases(lossy)

    cc = os.environ.get("CC", "cc")
    flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I."]
    args = [section_path, os.path.join(TOK, "cases.jsonl"), lossy, english_text(os.path.join(BUILD, "tokenizer_english.txt"))]
    builds = [("test_tokenizer", ["-O2"]),
              ("test_tokenizer_asan", ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"])]
    for exe, opt in builds:
        runs = [args + (["--quick"] if "asan" in exe else [])]
        if mini and "asan" not in exe:
            runs.append(["--cases-only", mini[0], mini[1]])
        out = os.path.join(BUILD, exe)
        cmd = [cc] + opt + flags + ["test/test_tokenizer.c", "tokenizer.c", "-o", out]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if p.returncode:
            report(False, f"compile {exe}", " ".join(cmd) + "\n" + p.stderr[-2000:])
            continue
        for run_args in runs:
            run_test(out, exe, run_args)
        if mini and "asan" not in exe:
            chat_formats(out, model_dir)
    print(f"tokenizer tests: {'FAILED' if harness.failures else 'all passed'}")
    return 1 if harness.failures else 0


def chat_formats(exe, model_dir):
    """ChatML (no thinking switch, no <bos> in the template) and Gemma 3 variants of the small tokenizer:
    format recognised by export_tokenizer.py, conversation rendered by tokenizer.c"""
    import export_tokenizer as et
    base = os.path.join(BUILD, "tokenizer_mini")
    msgs_chatml = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n  Hi  <|im_end|>\n"
                   "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")
    msgs_gemma = ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                  "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    gemma_tmpl = ("{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = "
                  "messages[0]['content'] + '\\n\\n' -%}{%- endif -%}{% for message in messages %}"
                  "{{ '<start_of_turn>' + role + '\\n' }}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
                  "{% endfor %}{%- if add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}")
    bad = []
    for fmt, expect, stops in (("chatml", msgs_chatml, "106 1"), ("gemma", msgs_gemma, "106 1")):
        d = os.path.join(BUILD, f"tokenizer_mini_{fmt}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(base, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        with open(os.path.join(base, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        if fmt == "gemma":     # back to Gemma 3's names for ids 105 and 106
            names = {105: "<start_of_turn>", 106: "<end_of_turn>"}
            tj["model"]["vocab"] = {names.get(i, p): i for p, i in tj["model"]["vocab"].items()}
            for a in tj["added_tokens"]:
                a["content"] = names.get(a["id"], a["content"])
            cfg["chat_template"] = gemma_tmpl
            cfg["eos_token"] = "<end_of_turn>"
            for k in list(cfg.get("added_tokens_decoder", {})):
                if int(k) in names:
                    cfg["added_tokens_decoder"][k]["content"] = names[int(k)]
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False)
        try:
            sec = et.build_tokenizer_section(d)
        except ValueError as e:
            bad.append(f"{fmt}: {e}")
            continue
        path = os.path.join(BUILD, f"tokenizer_mini_{fmt}.bin")
        with open(path, "wb") as f:
            f.write(sec)
        p = subprocess.run([exe, "--render", path], capture_output=True)
        got = p.stdout.decode("utf-8", "replace")
        if got != expect + "|stop " + stops:
            bad.append(f"{fmt}: expected {expect + '|stop ' + stops!r}, got {got!r}")
    report(not bad, "tokenizer chat formats detected and rendered (ChatML without thinking, Gemma 3)", "; ".join(bad))


def run_test(out, exe, run_args):
    print(f"== {os.path.relpath(out, ROOT)} {' '.join(os.path.relpath(a, ROOT) if os.sep in a else a for a in run_args)}",
          flush=True)
    p = subprocess.run([out] + run_args, cwd=ROOT, capture_output=True, text=True, errors="replace")
    for line in p.stdout.splitlines():
        if line.startswith("PASS "):
            line = line.replace("PASS tokenizer", f"PASS {'asan ' if 'asan' in exe else ''}tokenizer", 1)
        elif line.startswith("FAIL "):
            line = line.replace("FAIL tokenizer", f"FAIL {'asan ' if 'asan' in exe else ''}tokenizer", 1)
        print(line)
    n_fail = sum(line.startswith("FAIL ") for line in p.stdout.splitlines())
    harness.failures += n_fail
    if p.returncode and not n_fail:
        report(False, f"{exe} exited with status {p.returncode}", p.stderr[-3000:])
    elif p.returncode == 0 and p.stderr.strip():
        print(p.stderr[-2000:])


if __name__ == "__main__":
    sys.exit(main())
