#!/usr/bin/env python3
"""Writes the tokenizer corpus: one JSON string per line, 4,513 texts.

  * 3,012 random strings that mix ASCII words, CJK, Hangul (syllables and
    conjoining jamo), emoji (with ZWJ sequences and skin tones), combining
    marks, decomposed letters (for NFC), NBSP, ideographic and other Unicode
    spaces, CR/LF and tabs, contractions in both cases, digit runs and the
    special-token text of the real tokenizers;
  * 1,500 excerpts (20 to 2,000 characters) of English prose and C source;
  * one document of about 60 KB.

Prose and source come from files that do not change with this repository
(Debian's GPL text, llhttp's and jansson's sources), so the corpus is the
same on every machine that has the build dependencies, and is seeded.
Used by bench/tokenizer-encode.sh and tests/test_tokenizer_parity.c.
Usage: tokcorpus.py OUT.jsonl
"""
import json
import os
import random
import sys
import unicodedata

SOURCES = [
    "/usr/share/common-licenses/GPL-3",
    "/usr/share/common-licenses/Apache-2.0",
    "/usr/share/llhttp/llhttp.c",
    "/usr/share/llhttp/api.c",
    "/usr/share/llhttp/http.c",
    "/usr/include/jansson.h",
]

WORDS = ("the of and to in is it you that he was for on are with as I his they be at one "
         "have this from or had by hot word but what some we can out other were all there "
         "when up use your how said an each she which do their time if will way about many "
         "then them write would like so these her long make thing see him two has look more "
         "day could go come did number sound no most people my over know water than call "
         "first who may down side been now find any new work part take get place made live "
         "where after back little only round man year came show every good me give our under "
         "name very through just form sentence great think say help low line differ turn "
         "cause much mean before move right boy old too same tell does set three want air "
         "well also play small end put home read hand port large spell add even land here "
         "must big high such follow act why ask men change went light kind off need house "
         "HTTP GPU CUDA tokenizer Llama Qwen JSON UTF-8 McDonald's iPhone O'Neil").split()

CJK = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音送仿易"
HANGUL = "안녕하세요 세계 한국어 토큰 서버 모델 사람 시간 오늘 내일"
JAMO = ["\u1100\u1161", "\u1112\u1161\u11ab", "\u1103\u1173\u11af", "\u110b\u1165"]
EMOJI = ["\U0001F600", "\U0001F680", "\U0001F44D\U0001F3FD", "\U0001F469\u200D\U0001F4BB",
         "\u2764\uFE0F", "\U0001F1FA\U0001F1F8", "\U0001F9D1\u200D\U0001F91D\u200D\U0001F9D1",
         "\u263A", "\U0001F916"]
MARKS = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0323\u0302", "\u0302\u0323", "\u20DD",
         "\u0345", "\u05B7", "\u093F", "\u0E48"]
DECOMPOSED = ["e\u0301", "A\u030A", "n\u0303", "o\u0308\u0304", "\u212B", "\u2126", "\u0344",
              "\u0958", "\u1E9B\u0323", "\u0041\u0300\u0316", "\uFB2C", "\u2000",
              "\u304B\u3099", "\u30CF\u309A", "\uAC00\u11A8", "\u0B47\u0B3E", "\u0DD9\u0DCF",
              "\uF900", "\u2F800", "\u0340", "\u0F73", "\u1D15E"]
SPACES = [" ", "  ", "   ", "\u00A0", "\u3000", "\u2009", "\u202F", "\u2028", "\u0085",
          "\u180E", "\u200B", "\t", "\n", "\r\n", "\n\n", " \n", "\r", "\x0b", "\x0c"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL",
                "'D", "'x", "'", "\u2019s", "'\u017F", "'\u212A"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>",
           "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|endofprompt|>", "<|im_start", "<s", "|>"]
PUNCT = list(".,;:!?()[]{}<>\"'`~@#$%^&*-_=+/\\|") + ["...", "--", "->", "//", "/*", "*/",
                                                     "\u2014", "\u00AB", "\u00BB", "\u00BF"]
OTHER = ["\u00E9t\u00E9", "na\u00EFve", "Stra\u00DFe", "\u0391\u03B8\u03AE\u03BD\u03B1",
         "\u041C\u043E\u0441\u043A\u0432\u0430", "\u0627\u0644\u0639\u0631\u0628\u064A\u0629",
         "\u05E2\u05D1\u05E8\u05D9\u05EA", "\u0939\u093F\u0928\u094D\u0926\u0940",
         "\u0E44\u0E17\u0E22", "\u65E5\u672C\u8A9E\u3067\u3059", "\u30AB\u30BF\u30AB\u30CA",
         "\u00BD", "\u2163", "\u0663\u0664", "\uFF11\uFF12", "\u00B2", "\U0001D400\U0001D401",
         "\uFB01", "\u01C5", "\u02B0", "\u3005"]


def rand_word(r):
    k = r.random()
    if k < 0.55:
        w = r.choice(WORDS)
        if r.random() < 0.15:
            w = w.capitalize()
        elif r.random() < 0.05:
            w = w.upper()
        return w
    if k < 0.65:
        return "".join(r.choice(CJK) for _ in range(r.randint(1, 6)))
    if k < 0.70:
        return r.choice(HANGUL.split()) if r.random() < 0.7 else r.choice(JAMO)
    if k < 0.78:
        return r.choice(OTHER)
    if k < 0.88:
        return str(r.randint(0, 10 ** r.randint(1, 12)))
    return "".join(chr(r.randint(0x21, 0x7E)) for _ in range(r.randint(1, 5)))


# rand_piece's mix: below each bound of one draw, a word or a choice of a list.
PIECES = [(0.45, None), (0.62, SPACES), (0.68, CONTRACTIONS), (0.74, EMOJI), (0.79, MARKS),
          (0.84, DECOMPOSED), (0.90, PUNCT), (0.94, SPECIAL)]


def rand_piece(r):
    k = r.random()
    for bound, pool in PIECES:
        if k < bound:
            return rand_word(r) if pool is None else r.choice(pool)
    # Any code point of a few planes that Unicode 3.2 had already assigned:
    # the peer's regex engine knows Unicode 16, PCRE2 10.42 Unicode 14, and a
    # code point assigned in between is a letter for one and not the other.
    # Unicode 3.2's table ships with every Python, so the corpus does not
    # depend on the Python version.
    while True:
        cp = r.choice([r.randint(0x80, 0x2FFF), r.randint(0x3000, 0xFFFD),
                       r.randint(0x10000, 0x1FFFF), r.randint(0x20000, 0x2FFFF)])
        if not 0xD800 <= cp <= 0xDFFF and unicodedata.ucd_3_2_0.category(chr(cp)) != "Cn":
            return chr(cp)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tokcorpus.py OUT.jsonl")
    r = random.Random(20261202)
    pool = []
    for p in SOURCES:
        if not os.path.exists(p):
            sys.exit("tokcorpus.py: %s is missing (scripts/deps.sh build installs it)" % p)
        with open(p, encoding="utf-8", errors="replace") as f:
            pool.append(f.read())
    texts = []
    for _ in range(3012):
        texts.append("".join(rand_piece(r) for _ in range(r.randint(1, 40))))
    for _ in range(1500):
        src = r.choice(pool)
        n = r.randint(20, 2000)
        at = r.randint(0, max(0, len(src) - n))
        texts.append(src[at:at + n])
    doc = []
    size = 0
    while size < 60000:
        src = r.choice(pool)
        at = r.randint(0, max(0, len(src) - 3000))
        part = src[at:at + 3000]
        doc.append(part)
        size += len(part.encode("utf-8"))
    texts.append("\n\n".join(doc))
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        for t in texts:
            out.write(json.dumps(t, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
