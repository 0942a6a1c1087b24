"""A tiny synthetic Czech-English bitext that a 1-layer transformer learns in seconds.

The English side varies its wording (synonyms, word order) for the same Czech sentence, so a
model trained on it has several English ways to say one thing, as real bitext does.
"""
from __future__ import annotations

import random

SUBJECTS = [("muž", ["a man", "a guy"]), ("žena", ["a woman", "a lady"]), ("pes", ["a dog"]),
            ("dítě", ["a child", "a kid"]), ("chlapec", ["a boy"]), ("dívka", ["a girl"]),
            ("kočka", ["a cat"]), ("stařec", ["an old man", "an elderly man"])]
VERBS = [("sedí", ["is sitting", "sits"]), ("běží", ["is running", "runs"]),
         ("stojí", ["is standing", "stands"]), ("spí", ["is sleeping", "sleeps"]),
         ("čeká", ["is waiting", "waits"]), ("skáče", ["is jumping", "jumps"])]
PLACES = [("v parku", ["in the park", "in a park"]), ("na ulici", ["on the street", "on the road"]),
          ("na pláži", ["on the beach"]), ("u řeky", ["by the river", "near the river"]),
          ("ve městě", ["in the city", "in town"]), ("na trávě", ["on the grass"]),
          ("před domem", ["in front of the house", "outside the house"])]


def toy_bitext(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (czech, english) pairs, deterministic for a seed."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        (cs_s, en_s), (cs_v, en_v), (cs_p, en_p) = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(PLACES)
        subj, verb, place = rng.choice(en_s), rng.choice(en_v), rng.choice(en_p)
        if rng.random() < 0.25:
            en = f"{place[0].upper()}{place[1:]} , {subj} {verb} ."
        else:
            en = f"{subj[0].upper()}{subj[1:]} {verb} {place} ."
        cs = f"{cs_s[0].upper()}{cs_s[1:]} {cs_v} {cs_p} ."
        pairs.append((cs, en))
    return pairs


def toy_alignments(pairs: list[tuple[str, str]], tokenize) -> tuple[list, list]:
    """The known word alignment of toy_bitext PAIRS as word_alignments (models/bitext/divergence.py)
    gives it, both directions alike: every word of a Czech slot (subject, verb, place) linked to
    every word of that slot's English phrase, and the final marks to each other. Tests pass it to
    train_divergence instead of running eflomal, which takes no seed."""
    links = []
    for cs, en in pairs:
        cs_tok, en_tok = tokenize(cs), tokenize(en)
        row = []
        for table in (SUBJECTS, VERBS, PLACES):
            for cs_phrase, en_phrases in table:
                c = _find(cs_tok, tokenize(cs_phrase))
                e = next((p for p in (_find(en_tok, tokenize(x)) for x in en_phrases) if p), None)
                if c and e:
                    row += [(i, j) for i in c for j in e]
                    break
        if cs_tok and en_tok and cs_tok[-1] == en_tok[-1] == ".":
            row.append((len(cs_tok) - 1, len(en_tok) - 1))
        links.append(sorted(row))
    return links, links


def _find(tokens: list[str], phrase: list[str]) -> list[int]:
    """Positions of the first occurrence of PHRASE in TOKENS (empty when absent)."""
    for start in range(len(tokens) - len(phrase) + 1):
        if tokens[start:start + len(phrase)] == phrase:
            return list(range(start, start + len(phrase)))
    return []


def _english(rng, s, v, p) -> str:
    subj, verb, place = rng.choice(SUBJECTS[s][1]), rng.choice(VERBS[v][1]), rng.choice(PLACES[p][1])
    if rng.random() < 0.25:
        return f"{place[0].upper()}{place[1:]} , {subj} {verb} ."
    return f"{subj[0].upper()}{subj[1:]} {verb} {place} ."


def toy_paraphrases(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n English paraphrase pairs: two independent wordings of one (subject, verb, place) meaning."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s, v, p = rng.randrange(len(SUBJECTS)), rng.randrange(len(VERBS)), rng.randrange(len(PLACES))
        out.append((_english(rng, s, v, p), _english(rng, s, v, p)))
    return out


def toy_sts(n: int, seed: int = 0) -> list[tuple[float, str, str]]:
    """(gold, s1, s2): gold = 5 x the share of the three slots (subject, verb, place) both mean."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a = [rng.randrange(len(SUBJECTS)), rng.randrange(len(VERBS)), rng.randrange(len(PLACES))]
        b = [x if rng.random() < 0.5 else rng.randrange(k)
             for x, k in zip(a, (len(SUBJECTS), len(VERBS), len(PLACES)))]
        gold = 5 * sum(x == y for x, y in zip(a, b)) / 3
        out.append((gold, _english(rng, *a), _english(rng, *b)))
    return out


def paraphrase_rows(pairs, **extra) -> list[dict]:
    """Contract rows (schema.PARAPHRASES) for (reference, paraphrase) PAIRS, one pair id each."""
    from paracorpus.schema import paraphrase_row

    base = dict(src_lang="cs", tgt_lang="en", source="x", rank=1, cluster_id=1, cluster_size=1, forward_nll=1.0,
                combined_score=1.0, constraint_set=[], constraint_set_id=-1, num_sampled=1, num_surviving=1,
                mode="beam", config_hash="test", input_shard="toy.tsv")
    return [paraphrase_row(**{**base, "pair_id": f"p{i:04d}", "reference": a, "paraphrase": b, "input_index": i,
                              **extra}) for i, (a, b) in enumerate(pairs)]


def write_generation_run(root, rows: list[dict], shards: int = 2, reconciled: bool = True,
                         config_hash: str = "toy") -> str:
    """A committed generation run in ROOT (a path or URL) holding ROWS, spread over SHARDS files
    the way the job writes them (paracorpus.units, paracorpus.commit)."""
    from paracorpus import commit
    from paracorpus.schema import PARAPHRASES
    from paracorpus.units import _write_table

    root = str(root)
    files = []
    for shard in range(shards):
        files += _write_table(root, PARAPHRASES, [dict(r) for r in rows[shard::shards]], "cs-en", shard, shard,
                              commit.attempt_id())
    manifest = {"run_id": commit.new_run_id(), "config_hash": config_hash, "counts": {"reconciled": reconciled},
                "files": {"paraphrases": files, "rejects": []}}
    commit.publish(root, "_manifest.json", manifest, ("paraphrases", "rejects"))
    return root
