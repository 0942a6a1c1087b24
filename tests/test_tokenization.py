"""models/nmt/model_files/tokenization.py against fairseq's own hub pipeline (hub_utils.GeneratorHubInterface's
encode/decode over fairseq's encoders), string for string, on toy bitext and hostile text; codes
files told apart and refused; banned phrases in every segmentation a vocabulary allows."""
import pickle
from argparse import Namespace

import pytest

from models.nmt.model_files.tokenization import (BPES, MAX_SEGMENTATIONS, TOKENIZERS, Tokenization, check_codes,
                                                 detect_bpe, surface_forms)
from tests.toydata import toy_bitext

HOSTILE = [
    "Don't  stop &amp; <b>|x</b> it's O'Neil's",
    "It's a well-known fact: 1,000.5 > 999 & 'quotes' \"double\" co-operation x--y -- 100-200",
    "Příliš žluťoučký kůň úpěl ďábelské ódy — naïve café 日本語 😀",
    "  leading and   trailing spaces  ",
    "tabs\tand\nnewlines\r\nand\u00a0nbsp\u2009thin\u3000wide\u2028sep\x1cfs\x85nel \u200bzw",
    "@@ x@@ @@y a@@b ▁ under▁line ▁",
    "",
    "   ",
    "a",
    "x" * 300,
    "e.g. Mr. Smith, U.S.A., 3.14 % $5 #tag [brackets] {braces} (parens) ... ?! a|b || c",
    "\x00nul \x01ctrl \x7fdel",
    "ﬁle ligature Ⅻ and ½",
    "<unk> </s> <pad> &lt; already escaped &#124; &quot;",
    "'single' `back` ‘curly’ “double” „czech“ «guillemets»",
]
PLAIN = {"src": ["Muž sedí v parku.", "Cena je 1,5 Kč (asi), např. Praha & Brno.",
                 "Dobře známý „pes“ | kočka."],
         "tgt": ["A man is sitting in the park.", "It's a well-known café, isn't it?",
                 "The price rose to 1,000.5 dollars & more.", "She said \"hello\" (twice) | once."]}


def _texts(pairs):
    return [cs for cs, _ in pairs] + HOSTILE, [en for _, en in pairs] + HOSTILE[::-1]


@pytest.fixture(scope="module")
def corpus():
    return _texts(toy_bitext(200, seed=3))


@pytest.fixture(scope="module")
def codes(corpus, tmp_path_factory):
    """{bpe: codes file} learned on the corpus: subword-nmt merges, the same merges as fastBPE
    'a b count' lines, and a small sentencepiece model."""
    import sentencepiece as spm
    from sacremoses import MosesTokenizer
    from subword_nmt.learn_bpe import learn_bpe

    out = tmp_path_factory.mktemp("codes")
    cs, en = corpus
    tok = {lang: MosesTokenizer(lang) for lang in ("cs", "en")}
    lines = [tok[lang].tokenize(s, aggressive_dash_splits=True, return_str=True, escape=True)
             for lang, side in (("cs", cs), ("en", en)) for s in side]
    with open(out / "bpecodes", "w", encoding="utf-8") as f:
        learn_bpe([line + "\n" for line in lines], f, 300, min_frequency=2)
    merges = (out / "bpecodes").read_text(encoding="utf-8").splitlines()[1:]
    (out / "fastbpe.codes").write_text("".join(f"{m} {len(merges) - i}\n" for i, m in enumerate(merges)),
                                       encoding="utf-8")
    (out / "train.txt").write_text("\n".join(s for s in cs + en if s.strip()) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(out / "train.txt"), model_prefix=str(out / "sentencepiece.bpe"),
                                   vocab_size=300, model_type="bpe", character_coverage=1.0,
                                   hard_vocab_limit=False, num_threads=1, minloglevel=2)
    sp_model = str(out / "sentencepiece.bpe.model")
    return {"subword_nmt": str(out / "bpecodes"), "fastbpe": str(out / "fastbpe.codes"),
            "sentencepiece": sp_model, "spm": sp_model, "none": None}


class FairseqText:
    """fairseq's own hub text path: GeneratorHubInterface's methods, without a model."""
    from fairseq.hub_utils import GeneratorHubInterface as _Hub

    tokenize, apply_bpe, binarize, encode = _Hub.tokenize, _Hub.apply_bpe, _Hub.binarize, _Hub.encode
    detokenize, remove_bpe, string, decode = _Hub.detokenize, _Hub.remove_bpe, _Hub.string, _Hub.decode

    def __init__(self, tokenizer, bpe, codes_path, source_lang, target_lang, dictionary):
        from fairseq.data import encoders

        self.tokenizer = encoders.build_tokenizer(Namespace(
            tokenizer=None if tokenizer == "none" else tokenizer, source_lang=source_lang,
            target_lang=target_lang, moses_no_dash_splits=False, moses_no_escape=False))
        self.bpe = encoders.build_bpe(Namespace(
            bpe=None if bpe == "none" else bpe, bpe_codes=codes_path, bpe_separator="@@",
            sentencepiece_model=codes_path, sentencepiece_enable_sampling=False, sentencepiece_alpha=None))
        self.src_dict = self.tgt_dict = dictionary             # joined, as fairseq-preprocess's

    def pieces(self, text):
        """The pieces of TEXT's ids (the dictionary grows as fairseq-preprocess's would)."""
        self.src_dict.encode_line(self.apply_bpe(self.tokenize(text)), add_if_not_exist=True)
        return [self.src_dict[i] for i in self.encode(text)[:-1]]

    def text(self, pieces):
        import torch

        return self.decode(torch.tensor([self.tgt_dict.index(p) for p in pieces]))


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("bpe", ["subword_nmt", "fastbpe", "sentencepiece", "none"])
def test_matches_fairseq_hub_both_sides(tokenizer, bpe, corpus, codes):
    from fairseq.data import Dictionary

    cs, en = corpus
    ours = Tokenization(tokenizer, bpe, codes[bpe], "cs", "en")
    dictionary = Dictionary()
    cs_en = FairseqText(tokenizer, bpe, codes[bpe], "cs", "en", dictionary)     # encodes cs, decodes en
    en_cs = FairseqText(tokenizer, bpe, codes[bpe], "en", "cs", dictionary)     # encodes en, decodes cs
    for side, texts, hub_in, hub_out in (("src", cs, cs_en, en_cs), ("tgt", en, en_cs, cs_en)):
        for text in texts:
            pieces = ours.encode(text, side=side)
            assert pieces == hub_in.pieces(text), (side, text)
            # a hypothesis may stop anywhere, mid-word included (at the length limit)
            for hypothesis in (pieces, pieces[:len(pieces) // 2], pieces[1:-1]):
                assert ours.decode(hypothesis, side=side) == hub_out.text(hypothesis), (side, text)
    if bpe != "none":                                      # the corpus does exercise both
        assert any(p.endswith("@@") or p.startswith("▁") for p in ours.encode(HOSTILE[2])[:-1])
    if tokenizer == "moses":
        assert "&apos;" in "".join(ours.encode(HOSTILE[0], side="tgt"))


def test_sides_use_their_language():
    # Moses knows "např." as a Czech abbreviation (its dot stays), not as English
    t = Tokenization("moses", "none", None, "cs", "en")
    assert t.encode("To je např. Praha", side="src") == ["To", "je", "např.", "Praha"]
    assert t.encode("To je např. Praha", side="tgt") == ["To", "je", "např", ".", "Praha"]
    assert t.decode(["It", "&apos;s"], side="tgt") == "It's" != t.decode(["It", "&apos;s"], side="src")


def test_spm_is_the_projects_own_convention(corpus, codes):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=codes["spm"])
    t = Tokenization("none", "spm", codes["spm"], "cs", "en")
    for text in corpus[1][:50] + HOSTILE:
        pieces = sp.encode(text, out_type=str)
        assert t.encode(text, side="tgt") == pieces
        assert t.decode(pieces) == sp.decode_pieces(pieces)
    # fairseq's sentencepiece decode keeps what decode_pieces turns back into text
    fairseq_style = Tokenization("none", "sentencepiece", codes["sentencepiece"], "cs", "en")
    assert t.decode(["▁a", "<unk>"]) != fairseq_style.decode(["▁a", "<unk>"]) == "a<unk>"


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("bpe", [b for b in BPES])
def test_round_trip_on_plain_text(tokenizer, bpe, codes):
    t = Tokenization(tokenizer, bpe, codes[bpe], "cs", "en")
    for side in ("src", "tgt"):
        for text in PLAIN[side]:
            pieces = t.encode(text, side=side)
            assert t.encode(text, side=side) == pieces             # deterministic
            assert t.decode(pieces, side=side) == text


def test_pieces_count_for_a_length_limit(codes):
    t = Tokenization("moses", "subword_nmt", codes["subword_nmt"], "cs", "en")
    assert len(t.encode("Muž sedí v parku .")) >= 5
    assert t.encode("") == [] and t.encode(" \t\n ") == []


def test_lone_surrogates_do_not_crash(codes):
    # not Unicode text: fastBPE and sentencepiece raise on them (fairseq's hub too)
    for bpe in ("fastbpe", "sentencepiece", "spm", "subword_nmt"):
        t = Tokenization("moses", bpe, codes[bpe], "cs", "en")
        pieces = t.encode("bad \ud800 text", side="src")
        text = t.decode(pieces + ["\udfff"], side="src")
        assert "\ud800" not in "".join(pieces) and text.startswith("bad") and "\udfff" not in text
        if bpe in ("fastbpe", "subword_nmt"):
            assert "\ufffd" in text


def test_library_objects_built_once_and_lazily(codes, monkeypatch):
    import fastBPE

    built = []
    real = fastBPE.fastBPE
    monkeypatch.setattr(fastBPE, "fastBPE", lambda path: built.append(path) or real(path))
    t = Tokenization("moses", "fastbpe", codes["fastbpe"], "cs", "en")
    assert built == []
    for text in ("Muž sedí.", "Pes běží.", "A dog runs."):
        t.encode(text)
    assert built == [codes["fastbpe"]]


@pytest.mark.parametrize("bpe", ["subword_nmt", "fastbpe", "sentencepiece", "spm"])
def test_pickles_before_and_after_use(bpe, codes):
    t = Tokenization("moses", bpe, codes[bpe], "cs", "en")
    fresh = pickle.loads(pickle.dumps(t))
    pieces = t.encode("Muž sedí v parku, well-known café.")
    used = pickle.loads(pickle.dumps(t))                       # fastBPE's object cannot be pickled
    assert fresh.encode("Muž sedí v parku, well-known café.") == pieces
    assert used.encode("Muž sedí v parku, well-known café.") == pieces
    assert used.describe() == t.describe()


def test_describe_names_what_decides_the_pieces(codes):
    a = Tokenization("moses", "fastbpe", codes["fastbpe"], "cs", "en")
    d = a.describe()
    assert d["tokenizer"] == "moses" and d["bpe"] == "fastbpe" and (d["src_lang"], d["tgt_lang"]) == ("cs", "en")
    assert len(d["codes_sha256"]) == 64
    b = Tokenization("moses", "subword_nmt", codes["subword_nmt"], "cs", "en")
    assert b.describe()["codes_sha256"] != d["codes_sha256"] and b.fingerprint != a.fingerprint
    assert Tokenization("none", "none", None, "cs", "en").describe()["codes_sha256"] is None


@pytest.mark.parametrize("args, message", [
    (("nltk", "none", None, "cs", "en"), "tokenizer must be one of"),
    (("moses", "bpe", None, "cs", "en"), "bpe must be one of"),
    (("moses", "fastbpe", None, "cs", "en"), "needs its codes file"),
    (("moses", "none", "codes", "cs", "en"), "takes no codes file"),
    (("moses", "none", None, "c s", "en"), "src_lang must be"),
    (("moses", "none", None, "cs", "../en\n"), "tgt_lang must be"),
    (("moses", "fastbpe", "/no/such/codes", "cs", "en"), "no such file"),
])
def test_bad_arguments_refused_in_one_line(args, message):
    with pytest.raises(ValueError, match=message) as e:
        Tokenization(*args)
    assert "\n" not in str(e.value)


def test_bad_side_refused():
    t = Tokenization("moses", "none", None, "cs", "en")
    with pytest.raises(ValueError, match="side must be"):
        t.encode("x", side="source")
    with pytest.raises(TypeError):
        t.decode("a string")


# ---------------------------------------------------------------- codes files

def test_detect_each_kind(codes):
    assert detect_bpe(codes["subword_nmt"]) == "subword_nmt"
    assert detect_bpe(codes["fastbpe"]) == "fastbpe"
    assert detect_bpe(codes["sentencepiece"]) == "sentencepiece"
    for bpe in ("subword_nmt", "fastbpe", "sentencepiece", "spm"):
        check_codes(codes[bpe], bpe)


def _write(path, data):
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return str(path)


@pytest.mark.parametrize("name, data", [
    ("empty", b""),
    ("blank", b"\n\n  \n"),
    ("garbage", "hello there\nthis is prose, not codes\n"),
    ("binary", bytes(range(256)) * 8),
    ("bad_utf8", b"h e 10\n\xff\xfe x 3\n"),
    ("huge_line", b"a" * 5_000_000),
    ("header_only", "#version: 0.2\n"),
    ("fastbpe_bad_line", "h e 10\nhe l\n"),
])
def test_detect_refuses_in_one_line(name, data, tmp_path):
    path = _write(tmp_path / name, data)
    with pytest.raises(ValueError, match="not BPE codes") as e:
        detect_bpe(path)
    assert "\n" not in str(e.value) and name in str(e.value)


@pytest.mark.parametrize("bpe, data, why", [
    ("subword_nmt", "h e 10\nhe l 5\n", "fastBPE codes"),           # fastBPE codes as subword-nmt
    ("fastbpe", "#version: 0.2\nh e\nhe l\n", "subword-nmt header"),  # fastBPE would read it as a merge
    ("fastbpe", "h e 10\nhe l\n", "line 2"),                          # fastBPE would index past the end
    ("fastbpe", "h e 10\n\nhe l 5\n", "line 2"),
    ("subword_nmt", "#version: 0.2\nh e\n\nhe l\n", "line 3 is empty"),
    ("subword_nmt", "#version: 0.3\nh e\n", "versions"),
    ("subword_nmt", "", "no merges"),
    ("fastbpe", "", "no merges"),
    ("subword_nmt", b"#version: 0.2\n\xc3\x28 x\n", "not UTF-8"),
    ("fastbpe", b"h e " + b"9" * 10_000 + b"\n", "over 4096 bytes"),
    ("sentencepiece", "h e 10\n", "not a sentencepiece model"),
    ("spm", bytes(range(256)), "not a sentencepiece model"),
])
def test_check_codes_refuses_in_one_line(bpe, data, why, tmp_path):
    path = _write(tmp_path / "codes", data)
    with pytest.raises(ValueError, match=why) as e:
        check_codes(path, bpe)
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)
    with pytest.raises(ValueError):
        Tokenization("none", bpe, path, "cs", "en")


def test_not_a_file_refused(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        detect_bpe(str(tmp_path))
    with pytest.raises(ValueError, match="no such file"):
        check_codes(str(tmp_path / "missing\nname"), "fastbpe")


def test_check_codes_reads_the_whole_file(tmp_path):
    # the bad line is past what detect_bpe reads: the libraries would read it
    good = "".join(f"a{i} b{i} {i}\n" for i in range(10_000))
    path = _write(tmp_path / "codes", good + "bad line\n")
    assert detect_bpe(path) == "fastbpe"
    with pytest.raises(ValueError, match="line 10001"):
        check_codes(path, "fastbpe")


def test_headerless_subword_nmt_codes_accepted_when_named(tmp_path):
    # version 0.1: "</w>" is a symbol of its own, merged last
    path = _write(tmp_path / "codes", "h e\nhe l\nhel l\nhell o\nhello </w>\n")
    check_codes(path, "subword_nmt")
    with pytest.raises(ValueError, match="name the bpe"):
        detect_bpe(path)
    from fairseq.data import Dictionary

    hub = FairseqText("none", "subword_nmt", path, "cs", "en", Dictionary())
    t = Tokenization("none", "subword_nmt", path, "cs", "en")
    for text in ("hello", "hell hello helloo ohell"):
        assert t.encode(text) == hub.pieces(text)
    assert t.encode("hello helloo") == ["hello", "hello@@", "o"]


# ---------------------------------------------------------------- banned phrases

def _vocabulary(t, texts, side="tgt"):
    return {p for text in texts for p in t.encode(text, side=side)}


@pytest.mark.parametrize("bpe", ["subword_nmt", "fastbpe", "sentencepiece", "spm", "none"])
def test_banned_phrases_hold_canonical_forms_and_spell_the_word(bpe, corpus, codes):
    t = Tokenization("moses", bpe, codes[bpe], "cs", "en")
    for word in ("park", "sitting", "don't", "well-known", "City", "ŽLUŤOUČKÝ"):
        forms = surface_forms(word)
        vocabulary = _vocabulary(t, corpus[1] + forms)
        phrases = t.banned_phrases(word, vocabulary)
        canonical = [tuple(t.encode(form, side="tgt")) for form in forms]
        assert phrases[:len(set(canonical))] == list(dict.fromkeys(canonical))
        assert len(phrases) == len(set(phrases))
        spelled = {t.decode(p, side="tgt") for p in phrases}
        # Moses keeps "park." as one token before a lower-case word: that spelling is banned too
        assert set(forms) <= spelled <= set(forms) | {f + "." for f in forms}, word
        assert all(p in vocabulary for phrase in phrases for p in phrase)
        assert t.banned_phrases(word, vocabulary) == phrases                   # deterministic


def _house_codes(tmp_path):
    return _write(tmp_path / "codes", "#version: 0.2\nh o\nho u\nhou s\nhous e</w>\n")


def test_banned_phrases_find_other_segmentations(tmp_path):
    t = Tokenization("moses", "subword_nmt", _house_codes(tmp_path), "cs", "en")
    assert t.encode("house", side="tgt") == ["house"]
    vocabulary = {"house", "hou@@", "se", "h@@", "ouse", "ho@@", "use", "u@@", "HOUSE", "H@@", "Hou@@"}
    phrases = t.banned_phrases("house", vocabulary)
    assert phrases[0] == ("house",)
    for other in [("hou@@", "se"), ("h@@", "ouse"), ("ho@@", "use"), ("ho@@", "u@@", "se"), ("HOUSE",),
                  ("H@@", "ouse"), ("Hou@@", "se")]:
        assert other in phrases
    assert all(t.decode(p) in {"house", "House", "HOUSE"} for p in phrases)
    # without "se", every segmentation ending in it is gone
    fewer = t.banned_phrases("house", vocabulary - {"se"})
    assert ("hou@@", "se") not in fewer and ("h@@", "ouse") in fewer
    # nor is the canonical one kept when a piece of it is out of the vocabulary
    assert ("house",) not in t.banned_phrases("house", vocabulary - {"house"})


def test_banned_phrases_across_moses_tokens(tmp_path):
    t = Tokenization("moses", "subword_nmt", _house_codes(tmp_path), "cs", "en")
    canonical = tuple(t.encode("house's", side="tgt"))               # house &apos;s
    assert canonical[0] == "house" and t.decode(canonical) == "house's"
    vocabulary = set(canonical) | {"hou@@", "se", "&apos;@@", "s"}
    phrases = t.banned_phrases("house's", vocabulary)
    assert phrases[0] == canonical
    assert ("hou@@", "se") + canonical[1:] in phrases
    assert ("hou@@", "se", "&apos;@@", "s") in phrases
    assert all(t.decode(p) == "house's" for p in phrases)


def test_banned_phrases_sentencepiece_word_initial_space(tmp_path):
    import sentencepiece as spm

    (tmp_path / "t.txt").write_text("the house is big\nmy house\n" * 50 + "a big dog\n" * 20, encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "t.txt"), model_prefix=str(tmp_path / "m"),
                                   vocab_size=30, model_type="bpe", hard_vocab_limit=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    model_pieces = {sp.id_to_piece(i) for i in range(len(sp))}       # what its dictionary holds
    for bpe in ("sentencepiece", "spm"):
        t = Tokenization("none", bpe, str(tmp_path / "m.model"), "cs", "en")
        canonical = tuple(t.encode("house", side="tgt"))
        assert canonical == ("▁house",)
        phrases = t.banned_phrases("house", model_pieces)
        assert phrases[0] == canonical
        for other in [("▁", "h", "o", "u", "s", "e"), ("▁hou", "se"), ("▁", "hou", "se")]:
            assert other in phrases, (bpe, other)
        assert all(t.decode(p) == "house" for p in phrases)
        assert not any(p[0] == "▁" for p in t.banned_phrases("house", model_pieces - {"▁"}))
    # fairseq's sentencepiece decode is string surgery: any pieces of its dictionary will do
    t = Tokenization("none", "sentencepiece", str(tmp_path / "m.model"), "cs", "en")
    phrases = t.banned_phrases("house", {"▁house", "▁hou", "se", "▁hous", "▁", "house"})
    assert phrases == [("▁house",), ("▁hou", "se"), ("▁", "house")]


def test_banned_phrases_are_bounded(tmp_path):
    t = Tokenization("none", "subword_nmt", _write(tmp_path / "codes", "#version: 0.2\na a\n"), "cs", "en")
    vocabulary = {"a" * k for k in range(1, 60)} | {"a" * k + "@@" for k in range(1, 60)}
    word = "a" * 30                                     # 2**29 segmentations
    phrases = t.banned_phrases(word, vocabulary)
    assert len(phrases) == MAX_SEGMENTATIONS                 # one form (lower == upper == as written)
    assert phrases == t.banned_phrases(word, vocabulary)
    assert all(t.decode(p) == word for p in phrases)
    long_word = "a" * 50                                # over MAX_ENUMERATED_CHARS: canonical only
    assert t.banned_phrases(long_word, vocabulary) == [tuple(t.encode(long_word, side="tgt"))]


def test_banned_phrases_without_bpe_are_the_tokens():
    t = Tokenization("moses", "none", None, "cs", "en")
    vocabulary = {"house", "House", "HOUSE", "it", "&apos;s"}
    assert t.banned_phrases("house", vocabulary) == [("house",), ("House",), ("HOUSE",)]
    assert t.banned_phrases("it's", vocabulary) == [("it", "&apos;s")]
    assert t.banned_phrases("  ", vocabulary) == []
    # Moses escapes "<" and ">"; without it, a banned "</s>" must not ban the end of every hypothesis
    raw = Tokenization("none", "none", None, "cs", "en")
    assert raw.banned_phrases("</s>", {"</s>", "<unk>", "<s>", "<pad>"}) == []
    assert raw.banned_phrases("<unk>", {"</s>", "<unk>", "<s>", "<pad>"}) == []



def test_banned_phrases_include_the_word_with_a_period_moses_keeps_whole():
    # Moses keeps "A." whole (a nonbreaking prefix) and "park." before a lower-case word; either
    # detokenizes to the banned word plus a period, so a sample must not write it.
    t = Tokenization("moses", "none", None, "cs", "en")
    assert t.encode("A. Smith and the park. the dog", side="tgt")[:1] == ["A."]
    vocabulary = {"A", "a", "A.", "park", "park.", "Park", "."}
    assert ("A.",) in t.banned_phrases("A", vocabulary)
    assert ("park.",) in t.banned_phrases("park", vocabulary)
    assert all(t.decode(p) in {"A", "a", "A.", "a."} for p in t.banned_phrases("A", vocabulary))
    # the word itself, and a sentence-final period (its own token), are as before
    assert t.banned_phrases("park", vocabulary)[:2] == [("park",), ("Park",)]
    assert ("park", ".") not in t.banned_phrases("park", vocabulary)
