#!/usr/bin/env python3
"""Write tests/golden/tokenizer/golden.txt: reference token ids for tests/test_tokenizer.c.

The reference is llama.cpp's own tokenizer (llama-vocab.cpp, unicode.cpp) reached through
llama-cpp-python with vocab_only=True, on the real SmolLM2-135M-Instruct Q4_1 GGUF. The chat
template reference is the GGUF's own tokenizer.chat_template rendered with jinja2.

Usage: python3 tests/golden/tokenizer/make_golden.py [MODEL] > tests/golden/tokenizer/golden.txt
(run from the repo root; MODEL defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf).

Format (one record per line, parseable in C without a JSON library):
  # comment
  model_sha256 HEX
  case NAME SPECIAL ROUNDTRIP         SPECIAL: 1 = parse_special; ROUNDTRIP: 1 = decode == text
  text HEX                            the text's bytes in hex ("text -" for the empty string)
  file PATH NBYTES FNV64 SHA256       instead of text: the first NBYTES bytes of PATH
  ids N ID ID ...                     llama.cpp's ids (no BOS)
  eog N ID ...                        every id llama_vocab_is_eog() accepts
  vocab_fnv FNV64                     FNV-1a-64 over all ids of (u32 LE length, bytes) of
                                      llama_token_to_piece(id, special=True)
  chat SYSHEX USERHEX RENDERHEX       SYSHEX "-" = no system message (template default);
                                      "=" = the empty string
FNV-1a-64: h = 0xcbf29ce484222325; for each byte: h ^= b; h *= 0x100000001b3 (mod 2^64).
"""
import ctypes
import hashlib
import random
import sys

import jinja2
import llama_cpp
from gguf import GGUFReader

MODEL = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
GPL = "/usr/share/common-licenses/GPL-3"
GPL_BYTES = 20000


def fnv64(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def rand_text(seed, n):
    """n random codepoints from a mix of scripts, spaces, digits and punctuation."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0x20, 0x7E), (0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x24F),
              (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x2000, 0x206F), (0x3000, 0x30FF),
              (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF),
              (0x1D400, 0x1D7FF), (0x660, 0x669), (0x2160, 0x2188)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


C_CODE = r'''#include <stdio.h>
/* compute n! */
static unsigned long fact(int n) {
	unsigned long r = 1;
	for (int i = 2; i <= n; i++) r *= (unsigned long)i;
	return r;
}
int main(void) { printf("%lu\n", fact(10)); return 0; }
'''

PY_CODE = '''def fib(n: int) -> list[int]:
    """First n Fibonacci numbers."""
    a, b = 0, 1
    out = []
    for _ in range(n):
        out.append(a)
        a, b = b, a + b
    return out


if __name__ == "__main__":
    print(fib(20))  # [0, 1, 1, 2, ...]
'''

CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")

# (name, text, parse_special, roundtrip)
CASES = [
    ("selfcheck_hello", "Hello, we can use", 0, 1),
    ("selfcheck_france", "The capital of France is", 0, 1),
    ("selfcheck_newline", "\n", 0, 1),
    ("selfcheck_digits", "Hello world! 123", 0, 1),
    ("selfcheck_spaces", "  multiple   spaces", 0, 1),
    ("selfcheck_accents", "Café déjà vu.", 0, 1),
    ("selfcheck_system", "You are a helpful AI assistant named SmolLM, trained by Hugging Face", 0, 1),
    ("empty", "", 0, 1),
    ("prose", "The quick brown fox jumps over the lazy dog. It was the best of times, it was "
              "the worst of times; it was the age of wisdom, it was the age of foolishness.", 0, 1),
    ("accents", "Ångström naïve façade coöperate résumé São Paulo Zürich Œuvre ŁÓDŹ", 0, 1),
    ("cjk", "我爱自然语言处理。日本語のテキスト、カタカナ。한국어 텍스트입니다.", 0, 1),
    ("emoji", "I love 🍕 and 🎉🎉! 👩‍👩‍👧‍👦 family 🇫🇷 flag, thumbs 👍🏽.", 0, 1),
    ("combining", "e\u0301 a\u0308 n\u0303 Z\u0351\u0346a\u0360l\u0364g\u0489o ǹ \u0301start", 0, 1),
    ("digits", "3.14159265358979 1,000,000 2024-11-29 0x1F 1e-9 v3.10.12", 0, 1),
    ("long_number", "12345678901234567890123456789012345678901234567890", 0, 1),
    ("unicode_numbers", "½ ² ³ ٣٤٥ ४२ Ⅻ ⅷ 〇 ①②", 0, 1),
    ("whitespace", "a  b\t\tc\n\n\nd   \n  e \r\n f\t \n", 0, 1),
    ("trailing_spaces", "trailing spaces   ", 0, 1),
    ("leading_spaces", "    leading spaces", 0, 1),
    ("tabs_only", "\t\t\t", 0, 1),
    ("spaces_only", "     ", 0, 1),
    ("long_space_run", " " * 200 + "x" + "\n" * 50 + "y", 0, 1),
    ("contractions", "I'm sure it's what they've said: we'll see, you'd go, they're here, "
                     "I'd, it't. IT'S HE'LL DON'T 'S 'Re", 0, 1),
    ("apostrophes", "it’s l'homme ’re ''s rock'n'roll", 0, 1),
    ("code_c", C_CODE, 0, 1),
    ("code_python", PY_CODE, 0, 1),
    ("punctuation", "!!! ??? ... --- *** ((( ))) <<<>>> \"quoted\" 'single' ``back`` ;;; :: @#$%^&", 0, 1),
    ("url_email", "https://example.com/path?q=1&r=2#frag user.name+tag@example.org", 0, 1),
    ("markdown", "# Title\n\n- item 1\n- item 2\n\n**bold** _it_ `code`\n\n> quote\n", 0, 1),
    ("json", '{"key": [1, 2, 3], "nested": {"a": null, "b": true}, "s": "x\\ny"}', 0, 1),
    ("scripts", "Ελληνικά Русский текст العربية עברית हिन्दी ภาษาไทย ქართული Հայերեն", 0, 1),
    ("unicode_spaces", "a\u00a0b\u2003c\u3000d\u0085e\u200bf\u2028g\u202fh\u1680i", 0, 1),
    # U+180E: whitespace for PCRE2's \s, not for llama.cpp (not Unicode White_Space)
    ("mongolian_vs", "a\u180eb \u180e. c\u180e\u180e \n\u180e \u180e!", 0, 1),
    ("math_alnum", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝 𝟙𝟚𝟛 😀", 0, 1),
    # letters/numbers new in Unicode 15.0/15.1 (CJK ext H/I, Kawi, Nag Mundari, Kaktovik)
    ("unicode15", "\U00031350's \U0002EBF0\U0002EBF1x \U00011F04\U00011F05 \U0001E4D0'll "
                  "\U00011F50\U00011F51 \U0001D2C0\U0001E4F0!", 0, 1),
    ("mixed_alnum", "abc123def456 x2 H2O CO2 A1B2C3 ４５６ fullwidth", 0, 1),
    ("repeated_letters", "a" * 70 + " " + "ab" * 30, 0, 1),
    ("control_bytes", "\x01\x02\x03 \x7f\x1b[0m\x0b\x0c", 0, 1),
    ("no_token_bytes", "a\x04b\x06c\x1dd\x13e", 0, 0),
    ("chat_special", CHAT, 1, 1),
    ("chat_plain", CHAT, 0, 1),
    ("special_endoftext", "<|endoftext|>", 1, 1),
    ("special_endoftext_plain", "<|endoftext|>", 0, 1),
    ("special_adjacent", "<|im_start|><|im_end|><|im_start|x<|im_end|<|im_start|>", 1, 1),
    ("special_code", "<file_sep><reponame>my/repo<filename>a.py\n<gh_stars>10", 1, 1),
    ("special_in_word", "foo<|im_end|>bar <|endoftext|>baz", 1, 1),
    ("random_1", rand_text(1, 300), 0, 1),
    ("random_2", rand_text(2, 300), 0, 1),
    ("random_3", rand_text(3, 500), 0, 1),
    ("random_4", rand_text(4, 500), 0, 1),
]


def main():
    llm = llama_cpp.Llama(model_path=MODEL, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    out = sys.stdout
    with open(MODEL, "rb") as f:
        msha = hashlib.sha256(f.read()).hexdigest()
    out.write("# tokenizer goldens for tests/test_tokenizer.c, written by make_golden.py\n")
    out.write("# reference: llama.cpp tokenizer via llama-cpp-python %s (vocab_only); chat: jinja2 %s\n"
              % (llama_cpp.__version__, jinja2.__version__))
    out.write("model_sha256 %s\n" % msha)

    def tok(data, special):
        return llm.tokenize(data, add_bos=False, special=bool(special))

    for name, text, special, rt in CASES:
        data = text.encode("utf-8")
        ids = tok(data, special)
        out.write("case %s %d %d\n" % (name, special, rt))
        out.write("text %s\n" % (data.hex() if data else "-"))
        out.write("ids %d%s\n" % (len(ids), "".join(" %d" % i for i in ids)))

    with open(GPL, "rb") as f:
        data = f.read(GPL_BYTES)
    ids = tok(data, 0)
    out.write("case gpl3_20k 0 1\n")
    out.write("file %s %d %016x %s\n" % (GPL, len(data), fnv64(data), hashlib.sha256(data).hexdigest()))
    out.write("ids %d%s\n" % (len(ids), "".join(" %d" % i for i in ids)))

    eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    out.write("eog %d%s\n" % (len(eog), "".join(" %d" % i for i in eog)))

    h = 0xCBF29CE484222325
    buf = ctypes.create_string_buffer(1024)
    for i in range(n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
        assert 0 <= n <= len(buf), (i, n)
        piece = buf.raw[:n]
        h = fnv64(len(piece).to_bytes(4, "little"), h)
        h = fnv64(piece, h)
    out.write("vocab_fnv %016x\n" % h)

    r = GGUFReader(MODEL)
    f = r.fields["tokenizer.chat_template"]
    tmpl = jinja2.Environment().from_string(bytes(f.parts[f.data[0]]).decode())
    for sys_msg, user in [(None, "What is 2+2?"), ("You are terse.", "Name a colour."),
                          (None, ""), ("", "x"), ("Système ☃", "多行\nline two\n")]:
        msgs = ([] if sys_msg is None else [{"role": "system", "content": sys_msg}])
        msgs.append({"role": "user", "content": user})
        text = tmpl.render(messages=msgs, add_generation_prompt=True)
        sh = "-" if sys_msg is None else (sys_msg.encode().hex() or "=")
        out.write("chat %s %s %s\n" % (sh, user.encode().hex() or "=", text.encode().hex()))


if __name__ == "__main__":
    main()
