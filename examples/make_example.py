"""Write the bundled example bitext: Czech-English caption-like pairs from a small grammar.

    python examples/make_example.py [--n 3000] [--seed 7] [--out examples/cs-en.example.tsv]

The Czech is grammatical (adjectives agree with the noun's gender; present-tense verbs do not
inflect for gender; places are fixed locative phrases). Each Czech sentence gets one of several
correct English renderings, so a model trained on it knows several ways to say the same thing,
and back-translation sampling can produce real paraphrases. A few noisy lines at fixed positions
exercise the cleaning stage. Synthetic text shows the mechanics only: quality needs a real corpus.
"""
from __future__ import annotations

import argparse
import os
import random

# (masculine / feminine / neuter Czech noun, its gender, English variants)
NOUNS = [("muž", "m", ["man", "guy"]), ("žena", "f", ["woman", "lady"]), ("chlapec", "m", ["boy"]),
         ("dívka", "f", ["girl"]), ("dítě", "n", ["child", "kid"]), ("pes", "m", ["dog"]),
         ("kočka", "f", ["cat"]), ("stařec", "m", ["old man", "elderly man"]),
         ("turista", "m", ["tourist"]), ("prodavačka", "f", ["saleswoman", "shop assistant"])]
# Czech adjective stem with m/f/n endings, English variants.
ADJECTIVES = [("mlad", ["young"]), ("mal", ["small", "little"]), ("velk", ["big", "large"]),
              ("šťastn", ["happy", "cheerful"]), ("unaven", ["tired", "weary"]), ("vesel", ["merry", "jolly"])]
ENDINGS = {"m": "ý", "f": "á", "n": "é"}
VERBS = [("sedí", ["is sitting", "sits"]), ("stojí", ["is standing", "stands"]), ("běží", ["is running", "runs"]),
         ("čeká", ["is waiting", "waits"]), ("odpočívá", ["is resting", "rests", "is relaxing"]),
         ("skáče", ["is jumping", "jumps"]), ("čte knihu", ["is reading a book", "reads a book"]),
         ("drží deštník", ["is holding an umbrella", "holds an umbrella"]),
         ("hraje fotbal", ["is playing football", "plays soccer", "is playing soccer"]),
         ("jede na kole", ["is riding a bike", "is riding a bicycle", "is cycling"]),
         ("jí zmrzlinu", ["is eating ice cream", "eats an ice cream"]),
         ("pije kávu", ["is drinking coffee", "drinks coffee"])]
PLACES = [("v parku", ["in the park", "in a park"]), ("na ulici", ["on the street", "in the street"]),
          ("na pláži", ["on the beach", "at the beach"]), ("u řeky", ["by the river", "near the river"]),
          ("ve městě", ["in the city", "in town"]), ("na trávě", ["on the grass", "on the lawn"]),
          ("před domem", ["in front of the house", "outside the house"]),
          ("na nádraží", ["at the station", "at the train station"]), ("v zahradě", ["in the garden"]),
          ("na mostě", ["on the bridge"]), ("u jezera", ["by the lake", "near the lake"]),
          ("v kavárně", ["in a café", "in a coffee shop"])]
TIMES = [("", [""]), ("", [""]), ("ráno", ["in the morning"]), ("večer", ["in the evening"]),
         ("v létě", ["in summer", "in the summer"]), ("v zimě", ["in winter", "in the winter"])]


def _article(word: str) -> str:
    return "An" if word[0] in "aeiou" else "A"


def make_pair(rng: random.Random) -> tuple[str, str]:
    noun, gender, en_nouns = rng.choice(NOUNS)
    en_noun = rng.choice(en_nouns)
    cs_np, en_np = noun, en_noun
    if rng.random() < 0.6:
        stem, en_adjs = rng.choice(ADJECTIVES)
        cs_np, en_np = f"{stem}{ENDINGS[gender]} {noun}", f"{rng.choice(en_adjs)} {en_noun}"
    (cs_v, en_vs), (cs_p, en_ps), (cs_t, en_ts) = rng.choice(VERBS), rng.choice(PLACES), rng.choice(TIMES)
    en_v, en_p, en_t = rng.choice(en_vs), rng.choice(en_ps), rng.choice(en_ts)
    cs = " ".join(x for x in (cs_np[0].upper() + cs_np[1:], cs_v, cs_p, cs_t) if x) + "."
    subject = f"{_article(en_np)} {en_np}"
    tail = f" {en_t}" if en_t else ""
    if rng.random() < 0.25:
        en = f"{en_p[0].upper()}{en_p[1:]}{tail}, {subject.lower() if subject.startswith('A') else subject} {en_v}."
        en = en.replace(", a ", ", a ").replace(", an ", ", an ")
    else:
        en = f"{subject} {en_v} {en_p}{tail}."
    return cs, en


NOISE = {  # line number -> a record the cleaning stage must reject
    100: "Tento řádek nemá tabulátor",
    200: "\tA sentence without its Czech side.",
    300: "Muž sedí v parku.\tЧеловек сидит в парке.",
    500: "Muž\x07 sedí.\tA man sits.",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "cs-en.example.tsv"))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lines = []
    for i in range(a.n):
        if i in NOISE:
            lines.append(NOISE[i])
        elif i == 400:
            lines.append(lines[10])          # an exact duplicate
        else:
            lines.append("\t".join(make_pair(rng)))
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    distinct = len(set(lines))
    print(f"wrote {len(lines)} lines ({distinct} distinct, {len(NOISE) + 1} noisy) to {a.out}")
    for line in lines[:3]:
        print("  " + line.replace("\t", "  |  "))


if __name__ == "__main__":
    main()
