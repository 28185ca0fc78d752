#!/usr/bin/env python3
"""make_tokenizer_section.py OUT CKPT_DIR [chatml|gemma|none] - writes the tokenizer section that
export_weights.py embeds in a blob (export_tokenizer.build_tokenizer_section) to the file OUT, for tests,
fuzzers and benchmarks. CKPT_DIR holds tokenizer.json and tokenizer_config.json, or their .gz
(test/fixtures/tokenizer)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import export_tokenizer  # noqa: E402


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    try:
        data = export_tokenizer.build_tokenizer_section(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None)
    except ValueError as e:
        sys.exit(f"make_tokenizer_section.py: error: {e}")
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
    with open(sys.argv[1], "wb") as f:
        f.write(data)
    print(f"wrote {sys.argv[1]}: {len(data)} bytes")


if __name__ == "__main__":
    main()
