"""export_tokenizer.py - turn a Hugging Face tokenizer.json + tokenizer_config.json into the tokenizer
section of a zaya.c blob (parsed by tokenizer.c). Python 3.11 standard library only. Either file may be
gzipped (tokenizer.json.gz): the .gz is read when the plain file is absent; the plain file wins when both are.

    import export_tokenizer
    section = export_tokenizer.build_tokenizer_section("path/to/checkpoint", chat_format=None)

What is implemented (anything else is refused with a ValueError naming file, key, expected, found):
the Gemma 3 / ZAYA1 family of tokenizers, i.e. HF `tokenizers` with
  model          BPE, byte_fallback, (fuse_)unk, no dropout / subword prefix / word suffix / ignore_merges
  normalizer     Replace(" " -> "\u2581")  (alone or as the only member of a Sequence)
  pre_tokenizer  Split(" ", any behaviour) or none: after the normalizer there is no space left to split on
  decoder        Sequence[Replace("\u2581" -> " "), ByteFallback, Fuse]
  post_processor TemplateProcessing `[specials] $A [specials]` or none; for Llama/Gemma tokenizer classes
                 tokenizer_config.json's add_bos_token / add_eos_token win (transformers rebuilds the
                 post-processor from them)
  added tokens   normalized=false, lstrip=rstrip=single_word=false (matched in the raw text first)

Section format (little-endian, all offsets relative to the section start, arrays 8-byte aligned):

  header (HEADER_SIZE bytes)
    0   8s  magic "ZAYATOK\\0"           8  u32 version        12 u32 header size
    16  u64 section size                 24  u32 Adler-32 of bytes [32, size)
    28  u32 flags (1 byte_fallback, 2 fuse_unk)
    32  u32 n_tokens (max id + 1), n_vocab (BPE vocab entries), n_merges (merge list length = rank bound),
        n_added
    48  i32 bos, eos, pad, unk (-1 = none)
    64  u32 n_prefix, i32 prefix[4], u32 n_suffix, i32 suffix[4]    ids added by add_special_tokens
    104 u32 chat family (0 none, 1 chatml, 2 gemma), chat flags (1 trim content, 2 system goes into the
        first user turn, 4 drop earlier assistant turns' reasoning), n_stop, i32 stop[8]
    148 8 x (u32 offset, u32 length) chat strings in the string pool: begin, turn_start, role_end,
        turn_end, user_role, assistant_role, system_role, think_off
    212 u32 reserved
    216 7 x (u64 offset, u64 count) arrays:
        tokens      count x 16 B: u32 piece_off, u32 text_off, u16 piece_len, u16 text_len, u8 flags, u8 byte,
                    u16 0. piece = token string (encode side); text = piece with U+2581 -> ' ' (decode side).
                    flags: 1 exists, 2 added token, 4 skipped by skip_special_tokens, 8 byte token
                    (decoder ByteFallback: text is "<0xNN>", byte = NN), 16 in the BPE vocab
        strings     count x 1 B: the string pool
        piece_hash  count (power of 2) x u32: open addressing (linear probe) of the BPE vocab by piece
                    bytes, FNV-1a 32; 0xFFFFFFFF = empty
        merge_hash  count (power of 2) x 16 B: u32 left, u32 right, u32 rank, u32 merged id; left 0xFFFFFFFF =
                    empty; slot = merge_hash(left, right), linear probe
        trie_nodes  count x 12 B: u32 first edge, u32 edge count, i32 added-token id ending here (-1 none);
                    node 0 = root; the added tokens' bytes
        trie_edges  count x 8 B: u32 child node (> parent), u8 byte, 3 x u8 0; each node's edges sorted
        byte_ids    256 x i32: id of the vocab piece "<0xNN>" for byte fallback (-1 = missing)
"""
import gzip
import json
import os
import struct
import zlib

MAGIC = b"ZAYATOK\0"
VERSION = 1
HEADER_SIZE = 328
EMPTY = 0xFFFFFFFF
HINT_EXPORT = "the tokenizer files must come from a Hugging Face checkpoint of the ZAYA1 / Gemma 3 family"

F_EXISTS, F_ADDED, F_SKIP, F_BYTE, F_VOCAB = 1, 2, 4, 8, 16
CHAT_NONE, CHAT_CHATML, CHAT_GEMMA = 0, 1, 2
CF_TRIM, CF_SYSTEM_IN_USER, CF_DROP_REASONING = 1, 2, 4
MAX_SPECIAL_IDS = 4
MAX_STOP = 8
MAX_TOKEN_BYTES = 65535
LOWLINE = "\u2581"

_HEX = set("0123456789abcdefABCDEF")


def fnv1a(data: bytes) -> int:
    """FNV-1a 32-bit; tokenizer.c has the same function."""
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def merge_hash(a: int, b: int) -> int:
    """Hash of a merge pair of ids; tokenizer.c has the same function."""
    h = (a * 0x9E3779B1 + b * 0x85EBCA77 + 1) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h ^= h >> 12
    return h


def _fail(what, where, expected, found, hint=HINT_EXPORT):
    raise ValueError(f"{what}\n  where: {where}\n  expected: {expected}\n  found: {found}\n  hint: {hint}")


def _short(v, n=120):
    s = repr(v)
    return s if len(s) <= n else s[:n] + "..."


def _resolve(ckpt_dir, name):
    """Path of ckpt_dir/name, following a real symlink or a git symlink checked out as a small text file
    whose content is a relative path (e.g. "../../tokenizer/model/tokenizer.json")."""
    path = os.path.join(ckpt_dir, name)
    for _ in range(8):
        if not os.path.isfile(path):
            _fail(f"{name} is missing", path, "a file (or a symlink to one)", "nothing there",
                  "tokenizer.json and tokenizer_config.json (or their .gz) must be in the checkpoint folder")
        if os.path.getsize(path) > 4096:
            return path
        with open(path, "rb") as f:
            head = f.read()
        if head[:2] == b"\x1f\x8b":         # a small gzip file, not a pointer
            return path
        text = head.decode("utf-8", "replace").strip()
        if text.startswith("{") or not text or "\n" in text:
            return path
        target = os.path.join(os.path.dirname(path), text)
        if not os.path.isfile(target):
            _fail(f"{name} is a small text file that is not JSON and does not name an existing file", path,
                  "JSON, or a relative path to the real file (a git symlink checked out as text)",
                  _short(text), "check out the repository with symlinks, or copy the real file there")
        path = target
    _fail(f"{name}: too many levels of path pointers", path, "at most 8", "more", "")


def _locate(ckpt_dir, name):
    """ckpt_dir/name, or ckpt_dir/name.gz when only that is there: the plain file wins when both are."""
    plain = os.path.join(ckpt_dir, name)
    if os.path.lexists(plain) or not os.path.lexists(plain + ".gz"):
        return _resolve(ckpt_dir, name)
    return _resolve(ckpt_dir, name + ".gz")


def _load_json(path, name):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        _fail(f"cannot read {name}", path, "a readable file", str(e), "check the path and permissions")
    if path.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            _fail(f"{name}.gz is not a valid gzip file", path, "gzip data (as `gzip -9 -n` writes)", str(e),
                  "the file may be truncated; unpack it by hand with gunzip to see")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        _fail(f"{name} is not UTF-8", path, "UTF-8 JSON", str(e), "re-save the file as UTF-8")
    except (json.JSONDecodeError, RecursionError) as e:
        _fail(f"{name} is not valid JSON", path, "a JSON object", str(e), "the file may be truncated")


def _typename(types):
    if not isinstance(types, tuple):
        types = (types,)
    return " or ".join({str: "string", int: "integer", bool: "boolean", list: "array", dict: "object",
                        type(None): "null", float: "number"}.get(t, t.__name__) for t in types)


def _get(obj, key, types, where, required=True, default=None):
    if not isinstance(obj, dict):
        _fail("not a JSON object", where, "an object", _short(obj))
    if key not in obj:
        if required:
            _fail(f"missing key {key!r}", where, f"key {key!r}", f"keys {_short(sorted(obj))}")
        return default
    v = obj[key]
    tt = types if isinstance(types, tuple) else (types,)
    if not isinstance(v, tt) or (isinstance(v, bool) and bool not in tt):
        _fail(f"key {key!r} has the wrong type", f"{where}.{key}", _typename(types), _short(v))
    return v


def _utf8(s, where):
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as e:
        _fail("string is not valid Unicode (lone surrogate escape)", where, "valid UTF-8 text", str(e))


def _token_str(v, where):
    """bos_token etc. in tokenizer_config.json: a string or an AddedToken object {"content": ...}."""
    if v is None:
        return None
    if isinstance(v, dict):
        v = _get(v, "content", str, where)
    if not isinstance(v, str):
        _fail("special token has the wrong type", where, "a string or {\"content\": string}", _short(v))
    return v


def _is_byte_text(text: bytes):
    """HF decoders::ByteFallback: a token of exactly 6 bytes "<0x" XX ">" with XX parsed by Rust's
    u8::from_str_radix(XX, 16) (which also accepts a leading '+')."""
    if len(text) != 6 or not text.startswith(b"<0x") or not text.endswith(b">"):
        return None
    d = text[3:5].decode("latin-1")
    if d[0] == "+":
        d = d[1:]
    if not d or any(c not in _HEX for c in d):
        return None
    return int(d, 16)


# ----------------------------------------------------------------------------------------------------
# checks of the tokenizer.json pipeline

def _check_pipeline(tj, where):
    model = _get(tj, "model", dict, where)
    mw = f"{where}: model"
    mtype = model.get("type", "BPE")
    if mtype != "BPE":
        _fail("unsupported tokenizer model", f"{mw}.type", "BPE", _short(mtype))
    if model.get("byte_fallback") is not True:
        _fail("unsupported BPE option", f"{mw}.byte_fallback", "true", _short(model.get("byte_fallback")))
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key) not in (None, ""):
            _fail("unsupported BPE option", f"{mw}.{key}", "null", _short(model.get(key)))
    if model.get("ignore_merges", False) not in (False, None):
        _fail("unsupported BPE option", f"{mw}.ignore_merges", "false", _short(model.get("ignore_merges")))
    if not isinstance(model.get("fuse_unk", False), bool):
        _fail("bad BPE option", f"{mw}.fuse_unk", "true or false", _short(model.get("fuse_unk")))

    norm = tj.get("normalizer")
    if isinstance(norm, dict) and norm.get("type") == "Sequence" and isinstance(norm.get("normalizers"), list) \
            and len(norm["normalizers"]) == 1:
        norm = norm["normalizers"][0]
    if not (isinstance(norm, dict) and norm.get("type") == "Replace" and norm.get("pattern") == {"String": " "}
            and norm.get("content") == LOWLINE):
        _fail("unsupported normalizer", f"{where}: normalizer", 'Replace(String " " -> "\u2581")', _short(norm))

    pre = tj.get("pre_tokenizer")
    if pre is not None and not (isinstance(pre, dict) and pre.get("type") == "Split"
                                and pre.get("pattern") == {"String": " "} and pre.get("invert", False) is False):
        _fail("unsupported pre_tokenizer", f"{where}: pre_tokenizer",
              'null or Split(String " ") (a no-op after the normalizer)', _short(pre))

    dec = tj.get("decoder")
    want = [{"type": "Replace", "pattern": {"String": LOWLINE}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}]
    if not (isinstance(dec, dict) and dec.get("type") == "Sequence" and dec.get("decoders") == want):
        _fail("unsupported decoder", f"{where}: decoder", 'Sequence[Replace("\u2581" -> " "), ByteFallback, Fuse]',
              _short(dec, 300))
    for key in ("truncation", "padding"):
        if tj.get(key) is not None:
            _fail(f"unsupported {key}", f"{where}: {key}", "null", _short(tj.get(key)),
                  "zaya.c encodes whole texts; remove truncation/padding from tokenizer.json")
    return model


def _parse_vocab_merges(model, where):
    mw = f"{where}: model"
    vocab = _get(model, "vocab", dict, mw)
    if not vocab:
        _fail("empty vocabulary", f"{mw}.vocab", "piece -> id entries", "{}")
    pieces = {}
    for piece, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < 1 << 30:
            _fail("vocab id out of range", f"{mw}.vocab[{piece!r}]", "an integer 0 .. 2^30-1", _short(i))
        if i in pieces:
            _fail("two vocab pieces have the same id", f"{mw}.vocab", "unique ids",
                  f"{pieces[i]!r} and {piece!r} -> {i}")
        pieces[i] = piece
    by_piece = {p: i for i, p in pieces.items()}

    merges = _get(model, "merges", list, mw)
    mmap = {}
    for rank, m in enumerate(merges):
        if isinstance(m, str):
            parts = m.split(" ")
            if len(parts) != 2:
                _fail("bad merge", f"{mw}.merges[{rank}]", '"left right" (one space)', _short(m))
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m):
            parts = m
        else:
            _fail("bad merge", f"{mw}.merges[{rank}]", "[left, right] strings", _short(m))
        a, b = parts
        for s in (a, b, a + b):
            if s not in by_piece:
                _fail("merge uses a piece that is not in the vocab", f"{mw}.merges[{rank}]",
                      "left, right and left+right in model.vocab", f"{_short(m)}: {s!r} missing")
        mmap[(by_piece[a], by_piece[b])] = (rank, by_piece[a + b])      # HF: a later duplicate wins
    unk = model.get("unk_token")
    if unk is not None and (not isinstance(unk, str) or unk not in by_piece):
        _fail("unk_token is not in the vocab", f"{mw}.unk_token", "a piece of model.vocab", _short(unk))
    return pieces, by_piece, mmap, len(merges), (by_piece[unk] if unk is not None else -1), \
        bool(model.get("fuse_unk", False))


def _parse_added(tj, by_piece, where):
    added = _get(tj, "added_tokens", list, where, False, [])
    vocab_ids = set(by_piece.values())
    out = {}
    seen = {}
    for k, a in enumerate(added):
        aw = f"{where}: added_tokens[{k}]"
        content = _get(a, "content", str, aw)
        i = _get(a, "id", int, aw)
        if not 0 <= i < 1 << 30:
            _fail("added token id out of range", f"{aw}.id", "0 .. 2^30-1", i)
        if not content:
            _fail("empty added token", f"{aw}.content", "a non-empty string", "\"\"")
        flags = {f: _get(a, f, bool, aw, False, False) for f in ("special", "lstrip", "rstrip", "normalized",
                                                                  "single_word")}
        for f in ("lstrip", "rstrip", "normalized", "single_word"):
            if flags[f]:
                _fail(f"added token flag {f}=true is not implemented", f"{aw}.{f} ({content!r})", "false", "true",
                      "tokenizer.c matches added tokens in the raw text without stripping or word checks")
        if content in seen:
            _fail("two added tokens have the same content", aw, "unique contents",
                  f"{content!r} also at id {seen[content]}")
        if i in vocab_ids and content not in by_piece:
            _fail("added token replaces a different vocab piece with the same id", aw,
                  "an added token with the same content as model.vocab's piece of that id (or a new id)",
                  f"{content!r} at id {i}", "rename the piece in model.vocab too")
        if content in by_piece and by_piece[content] != i:
            _fail("added token id differs from its vocab id", aw, f"id {by_piece[content]} (model.vocab)", i,
                  "HF would use the vocab id; fix tokenizer.json")
        if i in out:
            _fail("two added tokens have the same id", aw, "unique ids", f"{i}: {out[i][0]!r} and {content!r}")
        seen[content] = i
        out[i] = (content, flags["special"])
    return out


def _post_processor(tj, cfg, by_content, where, cfg_where):
    """ids that encode(add_special_tokens=True) puts before and after the text."""
    cls = cfg.get("tokenizer_class") if isinstance(cfg.get("tokenizer_class"), str) else ""
    flags_given = any(k in cfg for k in ("add_bos_token", "add_eos_token"))
    if flags_given and cls.replace("Fast", "") in ("GemmaTokenizer", "LlamaTokenizer", "CodeLlamaTokenizer"):
        # transformers' Llama/Gemma fast tokenizers rebuild the post-processor from these two flags
        prefix, suffix = [], []
        for key, lst, tok_key in (("add_bos_token", prefix, "bos_token"), ("add_eos_token", suffix, "eos_token")):
            v = cfg.get(key, key == "add_bos_token")
            if not isinstance(v, bool):
                _fail(f"{key} has the wrong type", f"{cfg_where}: {key}", "true or false", _short(v))
            if v:
                name = _token_str(cfg.get(tok_key), f"{cfg_where}: {tok_key}")
                if name not in by_content:
                    _fail(f"{tok_key} is not a token", f"{cfg_where}: {tok_key}", "an added token or vocab piece",
                          _short(name))
                lst.append(by_content[name])
        return prefix, suffix
    pp = tj.get("post_processor")
    pw = f"{where}: post_processor"
    if pp is None:
        return [], []
    if not isinstance(pp, dict) or pp.get("type") != "TemplateProcessing":
        _fail("unsupported post_processor", pw, "null or TemplateProcessing", _short(pp))
    single = _get(pp, "single", list, pw)
    specials = _get(pp, "special_tokens", dict, pw, False, {})
    prefix, suffix, seen_a = [], [], False
    for k, piece in enumerate(single):
        if isinstance(piece, dict) and "Sequence" in piece:
            if _get(piece["Sequence"], "id", str, f"{pw}.single[{k}].Sequence") != "A" or seen_a:
                _fail("unsupported template", f"{pw}.single", "[SpecialToken...] $A [SpecialToken...]",
                      _short(single, 300))
            seen_a = True
        elif isinstance(piece, dict) and "SpecialToken" in piece:
            name = _get(piece["SpecialToken"], "id", str, f"{pw}.single[{k}].SpecialToken")
            st = _get(specials, name, dict, f"{pw}.special_tokens")
            ids = _get(st, "ids", list, f"{pw}.special_tokens[{name!r}]")
            for i in ids:
                if not isinstance(i, int) or isinstance(i, bool):
                    _fail("bad special token id", f"{pw}.special_tokens[{name!r}].ids", "integers", _short(ids))
            (suffix if seen_a else prefix).extend(ids)
        else:
            _fail("unsupported template piece", f"{pw}.single[{k}]", "Sequence or SpecialToken", _short(piece))
    if not seen_a:
        _fail("template without $A", f"{pw}.single", "one Sequence A", _short(single, 300))
    return prefix, suffix


# ----------------------------------------------------------------------------------------------------
# chat format

def _chat_format(cfg, chat_format, by_content, cfg_where):
    """(family, flags, strings[8], stop ids) of the chat template family."""
    tmpl = cfg.get("chat_template")
    if isinstance(tmpl, list):          # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        tmpl = named.get("default")
    if tmpl is not None and not isinstance(tmpl, str):
        _fail("chat_template has the wrong type", f"{cfg_where}: chat_template", "a string", _short(tmpl))
    choices = 'chat_format="chatml" (<|im_start|>role ... <|im_end|>), "gemma" (<start_of_turn>role ... ' \
              '<end_of_turn>) or "none"'
    if chat_format is None:
        if not tmpl:
            _fail("no chat_template to recognise the chat format from", f"{cfg_where}: chat_template",
                  "a Jinja chat template", "nothing", f"pass {choices}")
        chatml, gemma = "<|im_start|>" in tmpl, "<start_of_turn>" in tmpl
        if chatml == gemma:
            _fail("unknown chat template family", f"{cfg_where}: chat_template",
                  "a ChatML (<|im_start|>) or Gemma (<start_of_turn>) template", _short(tmpl, 200),
                  f"pass {choices}")
        chat_format = "chatml" if chatml else "gemma"
    if chat_format == "none":
        return CHAT_NONE, 0, [b""] * 8, []
    if chat_format not in ("chatml", "gemma"):
        raise ValueError(f"unknown chat_format {chat_format!r}\n  expected: None (detect), {choices}")
    tmpl = tmpl or ""
    bos = _token_str(cfg.get("bos_token"), f"{cfg_where}: bos_token") or ""
    eos = _token_str(cfg.get("eos_token"), f"{cfg_where}: eos_token")
    begin = bos if (not tmpl or "bos_token" in tmpl) else ""
    if chat_format == "chatml":
        family, flags = CHAT_CHATML, 0
        strings = [begin, "<|im_start|>", "\n", "<|im_end|>\n", "user", "assistant", "system", ""]
        if "</think>" in tmpl and "reasoning" in tmpl:
            flags |= CF_DROP_REASONING
        if "enable_thinking" in tmpl:
            strings[7] = "<think>\n</think>\n\n"
        turn_end = "<|im_end|>"
        needed = ["<|im_start|>", "<|im_end|>"] + (["<think>", "</think>"] if strings[7] else [])
    else:
        family, flags = CHAT_GEMMA, CF_TRIM | CF_SYSTEM_IN_USER
        strings = [begin, "<start_of_turn>", "\n", "<end_of_turn>\n", "user", "model", "", ""]
        turn_end = "<end_of_turn>"
        needed = ["<start_of_turn>", "<end_of_turn>"]
    for s in needed + ([begin] if begin else []):
        if s not in by_content:
            _fail(f"the {chat_format} chat format needs the token {s!r}, which this tokenizer does not have",
                  f"{cfg_where}: chat_template", f"{s!r} as an added token", "missing", f"pass {choices}")
    stop = []
    for s in (turn_end, eos, "<eos>"):
        if s is not None and s in by_content and by_content[s] not in stop:
            stop.append(by_content[s])
    return family, flags, [s.encode("utf-8") for s in strings], stop[:MAX_STOP]


# ----------------------------------------------------------------------------------------------------
# binary layout

def _table_size(n):
    cap = 16
    while cap < 2 * n + 1:          # load factor <= 1/2: short probes, always an empty slot
        cap *= 2
    return cap


def _build_trie(added):
    """Byte trie of the added tokens' contents: nodes (first_edge, n_edges, id), edges (child, byte)."""
    children = [{}]
    ids = [-1]
    for i, (content, _) in added.items():
        node = 0
        for b in content.encode("utf-8"):
            nxt = children[node].get(b)
            if nxt is None:
                nxt = len(children)
                children[node][b] = nxt
                children.append({})
                ids.append(-1)
            node = nxt
        ids[node] = i
    nodes, edges = [], []
    for n, ch in enumerate(children):
        nodes.append((len(edges), len(ch), ids[n]))
        edges.extend((ch[b], b) for b in sorted(ch))
    return nodes, edges


def build_tokenizer_section(ckpt_dir: str, chat_format: str | None = None) -> bytes:
    """The tokenizer section (bytes) for the checkpoint folder ckpt_dir; raises ValueError on bad input."""
    try:
        return _build(ckpt_dir, chat_format)
    except ValueError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, RecursionError, OverflowError, struct.error) as e:
        raise ValueError(f"unexpected structure in the tokenizer files of {ckpt_dir}: {type(e).__name__}: {e}\n"
                         f"  hint: {HINT_EXPORT}") from e


# ----------------------------------------------------------------------------------------------------
# a GGUF's own tokenizer (tokenizer.ggml.*, as llama.cpp's ZAYA port's converter writes it)

# llama.cpp's token types (gguf-py TokenType)
GGUF_NORMAL, GGUF_UNKNOWN, GGUF_CONTROL, GGUF_USER_DEFINED, GGUF_UNUSED, GGUF_BYTE = 1, 2, 3, 4, 5, 6
ZAYA1_NORMALIZER = {"type": "Replace", "pattern": {"String": " "}, "content": LOWLINE}
ZAYA1_PRE_TOKENIZER = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
ZAYA1_DECODER = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": LOWLINE}, "content": " "},
                                                  {"type": "ByteFallback"}, {"type": "Fuse"}]}


def gguf_tokenizer_json(kv, where):
    """(tokenizer.json, tokenizer_config.json) dicts rebuilt from a GGUF's tokenizer.ggml.* metadata (kv: key ->
    value). The GGUF keeps the vocabulary (tokens by id), the merges, token types, the special ids, add_bos/eos
    and the chat template; what it does not keep is the ZAYA1 / Gemma 3 family's, known: the normalizer
    (" " -> U+2581), the pre-tokenizer, the decoder, byte fallback with fuse_unk, and which tokens are added
    tokens (matched in the raw text before BPE): the CONTROL and USER_DEFINED ones, every multi-character piece
    no merge produces (other than <0xNN>), and the runs of newlines, tabs and of two or more U+2581.
    The BPE vocabulary is every id up to the last NORMAL or BYTE one. Raises ValueError."""
    model = kv.get("tokenizer.ggml.model")
    if model != "gemma4":
        _fail("not the ZAYA1 tokenizer", f"{where}: tokenizer.ggml.model",
              "'gemma4' (llama.cpp's ZAYA converter: a BPE vocabulary with merges)", _short(model),
              "give the checkpoint's tokenizer folder (bisect_llama.sh --config DIR, export_weights.py --tokenizer DIR)")
    tokens, types, merges = (kv.get("tokenizer.ggml." + k) for k in ("tokens", "token_type", "merges"))
    for name, v in (("tokens", tokens), ("token_type", types), ("merges", merges)):
        if not isinstance(v, list) or not v:
            _fail(f"the GGUF has no tokenizer.ggml.{name} array", where, "a non-empty array", _short(v),
                  "give the checkpoint's tokenizer folder (bisect_llama.sh --config DIR, export_weights.py "
                  "--tokenizer DIR)")
    if len(types) != len(tokens) or not all(isinstance(t, str) for t in tokens) \
            or not all(isinstance(t, int) for t in types) or not all(isinstance(m, str) for m in merges):
        _fail("bad tokenizer.ggml arrays", where, "tokens (strings) and token_type (integers) of one length, merges "
              "(strings)", f"{len(tokens)} tokens, {len(types)} types")
    produced = set()
    for m in merges:
        a, sep, b = m.partition(" ")
        if sep:
            produced.add(a + b)
    last = max((i for i, t in enumerate(types) if t in (GGUF_NORMAL, GGUF_BYTE)), default=-1)
    if last < 0:
        _fail("the GGUF's vocabulary has no normal token", f"{where}: tokenizer.ggml.token_type",
              "types 1 (normal) and 6 (byte) for the BPE vocabulary", _short(sorted(set(types))))
    vocab, added = {}, []
    for i, (piece, t) in enumerate(zip(tokens, types)):
        if i <= last and piece not in vocab:
            vocab[piece] = i
        run = piece and (set(piece) in ({"\n"}, {"\t"}) or (set(piece) == {LOWLINE} and len(piece) > 1))
        lone = len(piece) > 1 and piece not in produced and not (t == GGUF_BYTE or _is_byte_text(piece.encode()) is not None)
        if t in (GGUF_CONTROL, GGUF_USER_DEFINED) or run or (t == GGUF_NORMAL and lone):
            added.append({"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": t == GGUF_CONTROL})

    def name(key):
        i = kv.get("tokenizer.ggml." + key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None
    tj = {"model": {"type": "BPE", "dropout": None, "unk_token": name("unknown_token_id"), "fuse_unk": True,
                    "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": list(merges)},
          "normalizer": ZAYA1_NORMALIZER, "pre_tokenizer": ZAYA1_PRE_TOKENIZER, "decoder": ZAYA1_DECODER,
          "added_tokens": added, "post_processor": None}
    cfg = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": bool(kv.get("tokenizer.ggml.add_bos_token", True)),
           "add_eos_token": bool(kv.get("tokenizer.ggml.add_eos_token", False)), "bos_token": name("bos_token_id"),
           "eos_token": name("eos_token_id"), "pad_token": name("padding_token_id"), "unk_token": name("unknown_token_id")}
    if isinstance(kv.get("tokenizer.chat_template"), str):
        cfg["chat_template"] = kv["tokenizer.chat_template"]
    return tj, cfg


def build_tokenizer_section_from_gguf(kv, where, chat_format=None):
    """The tokenizer section from a GGUF's own tokenizer.ggml.* arrays (gguf_tokenizer_json); raises ValueError."""
    try:
        tj, cfg = gguf_tokenizer_json(kv, where)
        return _build_from(tj, cfg, f"{where} (tokenizer.ggml.*)", f"{where} (tokenizer.ggml.*)", chat_format)
    except ValueError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, RecursionError, OverflowError, struct.error) as e:
        raise ValueError(f"unexpected structure in the tokenizer arrays of {where}: {type(e).__name__}: {e}\n"
                         f"  hint: {HINT_EXPORT}") from e


def _build(ckpt_dir, chat_format):
    tj_path = _locate(ckpt_dir, "tokenizer.json")
    cfg_path = _locate(ckpt_dir, "tokenizer_config.json")
    tj = _load_json(tj_path, "tokenizer.json")
    cfg = _load_json(cfg_path, "tokenizer_config.json")
    return _build_from(tj, cfg, tj_path, cfg_path, chat_format)


def _build_from(tj, cfg, tj_path, cfg_path, chat_format):
    if chat_format is not None and not isinstance(chat_format, str):
        raise ValueError(f"chat_format must be None or a string, not {type(chat_format).__name__}")
    if not isinstance(tj, dict):
        _fail("tokenizer.json is not a JSON object", tj_path, "an object", type(tj).__name__)
    if not isinstance(cfg, dict):
        _fail("tokenizer_config.json is not a JSON object", cfg_path, "an object", type(cfg).__name__)

    model = _check_pipeline(tj, tj_path)
    pieces, by_piece, mmap, n_merges, unk_id, fuse_unk = _parse_vocab_merges(model, tj_path)
    added = _parse_added(tj, by_piece, tj_path)

    # id -> token string: added tokens win over the BPE vocab (HF id_to_token)
    tokens = dict(pieces)
    for i, (content, _) in added.items():
        tokens[i] = content
    n_tokens = max(tokens) + 1
    by_content = dict(by_piece)
    by_content.update({c: i for i, (c, _) in added.items()})
    specials = {c for c, sp in added.values() if sp}

    prefix, suffix = _post_processor(tj, cfg, by_content, tj_path, cfg_path)
    for lst, nm in ((prefix, "prefix"), (suffix, "suffix")):
        if len(lst) > MAX_SPECIAL_IDS or any(i not in tokens for i in lst):
            _fail(f"post-processor {nm} ids unsupported", tj_path, f"at most {MAX_SPECIAL_IDS} existing ids", lst)

    def tok_id(key):
        name = _token_str(cfg.get(key), f"{cfg_path}: {key}")
        if name is None:
            return -1
        if name not in by_content:
            _fail(f"{key} is not a token", f"{cfg_path}: {key}", "an added token or vocab piece", _short(name))
        return by_content[name]
    bos, eos, pad = tok_id("bos_token"), tok_id("eos_token"), tok_id("pad_token")
    cfg_unk = tok_id("unk_token")
    unk = unk_id if unk_id >= 0 else cfg_unk

    family, cflags, cstrings, stop = _chat_format(cfg, chat_format, by_content, cfg_path)

    # --- string pool and token table
    pool = bytearray()
    interned = {}

    def intern(b):
        off = interned.get(b)
        if off is None:
            off = interned[b] = len(pool)
            pool.extend(b)
        return off

    tok_rows = bytearray(16 * n_tokens)
    for i, s in tokens.items():
        piece = _utf8(s, f"{tj_path}: token {i}")
        text = piece.replace(LOWLINE.encode("utf-8"), b" ")
        if len(piece) > MAX_TOKEN_BYTES:
            _fail("token too long", f"{tj_path}: token {i}", f"at most {MAX_TOKEN_BYTES} bytes", len(piece))
        flags = F_EXISTS
        if i in added:
            flags |= F_ADDED
        if s in specials:
            flags |= F_SKIP
        if i in pieces:
            flags |= F_VOCAB
        byte = _is_byte_text(text)
        if byte is not None:
            flags |= F_BYTE
        struct.pack_into("<IIHHBBH", tok_rows, 16 * i, intern(piece), intern(text), len(piece), len(text), flags,
                         byte or 0, 0)
    chat_refs = [(intern(s), len(s)) for s in cstrings]

    # --- piece hash (BPE vocab only: what the model looks up)
    pcap = _table_size(len(pieces))
    phash = [EMPTY] * pcap
    mask = pcap - 1
    for i, s in pieces.items():
        h = fnv1a(s.encode("utf-8")) & mask
        while phash[h] != EMPTY:
            h = (h + 1) & mask
        phash[h] = i

    # --- merge hash
    mcap = _table_size(len(mmap))
    mrows = [None] * mcap
    mask = mcap - 1
    for (a, b), (rank, new) in mmap.items():
        h = merge_hash(a, b) & mask
        while mrows[h] is not None:
            h = (h + 1) & mask
        mrows[h] = (a, b, rank, new)
    empty_row = struct.pack("<4I", EMPTY, EMPTY, EMPTY, EMPTY)
    pack4 = struct.Struct("<4I").pack

    nodes, edges = _build_trie(added)
    byte_ids = [by_piece.get(f"<0x{b:02X}>", -1) for b in range(256)]

    # --- assemble
    arrays = [
        bytes(tok_rows),
        bytes(pool),
        struct.pack(f"<{pcap}I", *phash),
        b"".join(empty_row if r is None else pack4(*r) for r in mrows),
        b"".join(struct.pack("<IIi", *n) for n in nodes),
        b"".join(struct.pack("<IB3x", c, b) for c, b in edges),
        struct.pack("<256i", *byte_ids),
    ]
    counts = [n_tokens, len(pool), pcap, mcap, len(nodes), len(edges), 256]
    body = bytearray()
    descs = []
    for data, count in zip(arrays, counts):
        descs.append((HEADER_SIZE + len(body), count))
        body.extend(data)
        body.extend(bytes(-len(body) % 8))
    size = HEADER_SIZE + len(body)

    hdr = bytearray(HEADER_SIZE)
    struct.pack_into("<8sIIQ", hdr, 0, MAGIC, VERSION, HEADER_SIZE, size)
    struct.pack_into("<I", hdr, 28, 1 | (2 if fuse_unk else 0))
    struct.pack_into("<4I", hdr, 32, n_tokens, len(pieces), n_merges, len(added))
    struct.pack_into("<4i", hdr, 48, bos, eos, pad, unk)

    def pad_ids(lst, n):
        return list(lst) + [-1] * (n - len(lst))
    struct.pack_into("<I4iI4i", hdr, 64, len(prefix), *pad_ids(prefix, 4), len(suffix), *pad_ids(suffix, 4))
    struct.pack_into("<3I8i", hdr, 104, family, cflags, len(stop), *pad_ids(stop, MAX_STOP))
    for k, (off, ln) in enumerate(chat_refs):
        struct.pack_into("<II", hdr, 148 + 8 * k, off, ln)
    for k, (off, count) in enumerate(descs):
        struct.pack_into("<QQ", hdr, 216 + 16 * k, off, count)
    out = bytearray(hdr) + body
    struct.pack_into("<I", out, 24, zlib.adler32(memoryview(out)[32:]))
    return bytes(out)


if __name__ == "__main__":
    import sys
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: export_tokenizer.py CHECKPOINT_DIR OUT [chatml|gemma|none]")
    try:
        data = build_tokenizer_section(sys.argv[1], sys.argv[3] if len(sys.argv) == 4 else None)
    except ValueError as e:
        sys.exit(f"export_tokenizer.py: error: {e}")
    with open(sys.argv[2], "wb") as f:
        f.write(data)
    print(f"wrote {sys.argv[2]}: {len(data)} bytes")
