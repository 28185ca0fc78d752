#!/usr/bin/env python3
"""test_gguf_tokenizer.py - the tokenizer from a GGUF alone (export_tokenizer.build_tokenizer_section_from_gguf):
the vocabulary and merges of llama.cpp's ZAYA port's GGUF encode like Hugging Face's tokenizer.

    python3 test/test_gguf_tokenizer.py

test/fixtures/gguf/compact-F32.gguf is the port converter's GGUF of the compact fixture without its big
tokenizer arrays (tools/gguf_strip.py); test/fixtures/gguf/compact-tokenizer-arrays.json records those arrays
(SHA-256 of the tokens and merges, the token types run-length). The test
1. rebuilds the arrays from the fixture's tokenizer.json (ids in order, an added token's content over the vocab
   piece; merges as "left right"; the recorded token types) and checks them against the recorded SHA-256:
   they are the real GGUF's arrays, byte for byte;
2. builds the tokenizer section from the GGUF's metadata plus those arrays alone: it must be the section built
   from tokenizer.json + tokenizer_config.json, byte for byte;
3. encodes and decodes the fixture's Hugging Face cases (test/fixtures/tokenizer/cases.jsonl) with it
   (test/test_tokenizer.c --cases-only);
4. refuses another tokenizer model or missing arrays with a ValueError that names --config / --tokenizer.
"""
import gzip
import hashlib
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check, finish, need_fixtures, run, temp_dir  # noqa: E402
import export_tokenizer as et  # noqa: E402
import gguf  # noqa: E402

TOK = need_fixtures("tokenizer")
REC = need_fixtures("gguf", "compact-tokenizer-arrays.json")
GG = need_fixtures("gguf", "compact-F32.gguf")
TMP = temp_dir("zaya_gguf_tok_")

with open(REC) as f:
    rec = json.load(f)
with gzip.open(os.path.join(TOK, "tokenizer.json.gz")) as f:
    tj = json.load(f)
by_id = {i: p for p, i in tj["model"]["vocab"].items()}
by_id.update({a["id"]: a["content"] for a in tj["added_tokens"]})
tokens = [by_id[i] for i in range(max(by_id) + 1)]
merges = [" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]]
types = [t for t, n in rec["token_type_runs"] for _ in range(n)]
check(len(tokens) == rec["n_tokens"] == len(types)
      and hashlib.sha256("\0".join(tokens).encode()).hexdigest() == rec["tokens_sha256"]
      and hashlib.sha256("\n".join(merges).encode()).hexdigest() == rec["merges_sha256"],
      "the GGUF's tokenizer.ggml.tokens / merges rebuilt from tokenizer.json match the recorded converter output",
      f"{len(tokens)} tokens, {len(types)} types, recorded {rec['n_tokens']}")

kv = dict(gguf.GGUFFile(GG).kv)
kv.update({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
           "tokenizer.ggml.scores": [-1000.0] * len(tokens)})
try:
    section = et.build_tokenizer_section_from_gguf(kv, GG)
    err = ""
except ValueError as e:
    section, err = None, str(e)
hf = et.build_tokenizer_section(TOK)
check(section == hf, "the section from the GGUF's arrays alone is the one from tokenizer.json + tokenizer_config.json, "
      "byte for byte", err or f"{len(section)} vs {len(hf)} bytes")

path = os.path.join(TMP, "gguf_section.bin")
with open(path, "wb") as f:
    f.write(section or b"")
exe = os.path.join(TMP, "test_tokenizer")
rc, _, cerr = run(["cc", "-O2", "-std=c11", "-I" + ROOT, os.path.join(ROOT, "test", "test_tokenizer.c"),
                   os.path.join(ROOT, "tokenizer.c"), "-o", exe])
check(rc == 0, "build test_tokenizer.c", cerr[-300:])
p = subprocess.run([exe, "--cases-only", path, os.path.join(TOK, "cases.jsonl")], capture_output=True, text=True)
lines = p.stdout.splitlines()
fails = [ln for ln in lines if ln.startswith("FAIL")]
check(p.returncode == 0 and lines and not fails, f"the GGUF's tokenizer on the Hugging Face cases ({len(lines)} checks)",
      "\n".join(fails[:5]) or p.stderr[-300:])

for what, change in (("tokenizer.ggml.model 'llama'", {"tokenizer.ggml.model": "llama"}),
                     ("no tokenizer.ggml.merges", {"tokenizer.ggml.merges": None})):
    bad = dict(kv, **change)
    try:
        et.build_tokenizer_section_from_gguf(bad, GG)
        msg = "accepted"
    except ValueError as e:
        msg = str(e)
    check("--config DIR" in msg and "--tokenizer DIR" in msg and "hint" in msg, f"{what}: a ValueError naming the flags",
          msg[-300:])
finish()
