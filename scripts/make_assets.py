"""Generate titan-rocm's shipped debug tokenizer and text dataset, deterministically.

Everything here is made from scratch: a seeded generator writes English-like documents
from a small grammar and word lists written for this script, and a byte-level BPE
(HuggingFace ``tokenizers``, a TorchTitan dependency) is trained on them. Nothing is
downloaded or copied from a corpus, so the debug configs run on a machine with no
network.

Outputs (under ``--out``, default ``titan_rocm/assets``):

* ``tokenizer/tokenizer.json`` and ``tokenizer/tokenizer_config.json``: what TorchTitan
  0.2.2's ``HuggingFaceTokenizer`` loads from ``[model] hf_assets_path``. Special tokens
  ``<|begin_of_text|>`` (bos), ``<|end_of_text|>`` (eos), ``<|pad|>`` have ids 0, 1, 2;
  the whole vocabulary fits the debug models' ``vocab_size = 2048``.
* ``dataset/train.jsonl``: one ``{"text": ...}`` document a line, the layout of
  TorchTitan's ``c4_test`` (``load_dataset(path, split="train")``, field ``text``).

Run from the repository root: ``python scripts/make_assets.py``. Running it twice gives
the same bytes; ``tests/tt022/test_configs.py`` regenerates into a temporary directory and
compares against the shipped files.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

SEED = 20260
NUM_DOCUMENTS = 2200
VOCAB_SIZE = 2000
BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "titan_rocm" / "assets"

# --- Word lists (written for this script) -------------------------------------------

NOUNS = (
    "river garden window teacher engine harbor valley lantern market kitchen bridge "
    "forest village student farmer painter doctor sailor baker pilot mountain island "
    "library station letter bottle basket candle ladder pocket hammer mirror clock "
    "wheel tower castle meadow orchard cottage factory office table chair blanket "
    "notebook pencil signal machine circuit battery motor sensor cable antenna "
    "compass map journey storm cloud thunder rainbow shadow lake ocean desert canyon "
    "planet comet telescope crystal mineral fossil seed flower branch leaf root "
    "apple lemon onion carrot potato pepper cheese bread soup kettle spoon plate "
    "horse rabbit sparrow falcon turtle dolphin salmon beetle spider fox owl deer "
    "song story poem picture puzzle question answer reason promise secret habit "
    "festival holiday season morning evening winter summer autumn spring minute "
    "engineer gardener musician neighbor captain merchant traveler scientist cook"
).split()

VERBS = (  # base, past
    ("carry", "carried"), ("open", "opened"), ("close", "closed"), ("paint", "painted"),
    ("build", "built"), ("find", "found"), ("watch", "watched"), ("follow", "followed"),
    ("repair", "repaired"), ("measure", "measured"), ("visit", "visited"),
    ("cross", "crossed"), ("clean", "cleaned"), ("study", "studied"), ("plant", "planted"),
    ("cook", "cooked"), ("write", "wrote"), ("read", "read"), ("draw", "drew"),
    ("bring", "brought"), ("keep", "kept"), ("hold", "held"), ("leave", "left"),
    ("lift", "lifted"), ("push", "pushed"), ("pull", "pulled"), ("count", "counted"),
    ("explore", "explored"), ("notice", "noticed"), ("collect", "collected"),
    ("borrow", "borrowed"), ("return", "returned"), ("test", "tested"),
    ("describe", "described"), ("improve", "improved"), ("protect", "protected"),
    ("share", "shared"), ("sell", "sold"), ("buy", "bought"), ("teach", "taught"),
    ("catch", "caught"), ("fold", "folded"), ("light", "lit"), ("mend", "mended"),
    ("load", "loaded"), ("sort", "sorted"), ("wash", "washed"), ("check", "checked"),
)

INTRANSITIVE = (  # base, past
    ("arrive", "arrived"), ("wait", "waited"), ("sleep", "slept"), ("laugh", "laughed"),
    ("travel", "traveled"), ("rest", "rested"), ("shine", "shone"), ("fall", "fell"),
    ("grow", "grew"), ("sing", "sang"), ("run", "ran"), ("swim", "swam"),
    ("return", "returned"), ("disappear", "disappeared"), ("begin", "began"),
    ("stop", "stopped"), ("listen", "listened"), ("wander", "wandered"),
)

ADJECTIVES = (
    "quiet bright small large old young green blue red golden silver wooden heavy "
    "light narrow wide gentle careful curious patient busy empty full warm cold "
    "ancient modern simple strange familiar distant nearby tall short round sharp "
    "soft clever brave calm noisy tidy dusty shiny rusty fresh ripe sweet bitter "
    "hidden open broken steady slow quick happy tired hungry lucky proud honest"
).split()

ADVERBS = (
    "slowly quickly carefully quietly happily suddenly finally often rarely gently "
    "eagerly calmly patiently loudly softly early later together again nearly"
).split()

PREPOSITIONS = (
    "near behind under over beside across through along around toward inside past"
).split()

NAMES = (
    "Ada Boris Clara Dmitri Elena Farid Greta Hiro Ines Jonas Kira Luca Maya Nadia "
    "Omar Priya Quinn Rosa Samir Tara Umar Vera Wen Ximena Yusuf Zoe Aiko Bruno "
    "Chloe Diego Emil Fatima Gustav Hana Ivan Julia Kofi Lena Mateo Nina"
).split()

PLACES = (
    "the northern valley, the old harbor, the river town, the mountain pass, the "
    "coastal village, the city market, the university, the research station, the "
    "small island, the train depot, the west district, the country fair, the museum, "
    "the café on the corner, the naïve painters' school, the Zürich workshop"
).split(", ")

TIMES = (
    "yesterday, this morning, last winter, in the evening, at noon, on Monday, "
    "before dawn, after the rain, during the festival, every spring, later that week, "
    "at the end of the season, two days ago, in the early summer"
).split(", ")

CONNECTORS = ("Then", "Later", "Afterward", "Meanwhile", "Soon", "Still", "Next")


def plural(noun: str) -> str:
    """English plural of a word from NOUNS (regular rules, plus the few irregulars)."""
    irregular = {"leaf": "leaves", "deer": "deer", "fox": "foxes", "potato": "potatoes"}
    if noun in irregular:
        return irregular[noun]
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def article(word: str) -> str:
    """'a' or 'an' for the following word."""
    return "an" if word[0] in "aeiou" else "a"


class SentenceGenerator:
    """Seeded generator of English-like sentences and documents."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def pick(self, seq):
        """One element of ``seq``."""
        return seq[self.rng.randrange(len(seq))]

    def noun_phrase(self) -> str:
        """'the quiet river', 'a lantern', 'three old bottles', 'Maya's kettle'."""
        noun = self.pick(NOUNS)
        roll = self.rng.random()
        if roll < 0.35:
            return f"the {self.pick(ADJECTIVES)} {noun}"
        if roll < 0.55:
            adj = self.pick(ADJECTIVES)
            return f"{article(adj)} {adj} {noun}"
        if roll < 0.7:
            count = self.pick(("two", "three", "four", "several", "many", "a few"))
            return f"{count} {plural(noun)}"
        if roll < 0.8:
            return f"{self.pick(NAMES)}'s {noun}"
        return f"the {noun}"

    def subject(self) -> str:
        """A name or a noun phrase, to open a clause."""
        return self.pick(NAMES) if self.rng.random() < 0.4 else self.noun_phrase()

    def clause(self) -> str:
        """One independent clause in the past tense."""
        roll = self.rng.random()
        if roll < 0.45:
            _, past = self.pick(VERBS)
            text = f"{self.subject()} {past} {self.noun_phrase()}"
        elif roll < 0.7:
            _, past = self.pick(INTRANSITIVE)
            text = f"{self.subject()} {past} {self.pick(PREPOSITIONS)} {self.noun_phrase()}"
        elif roll < 0.85:
            text = f"{self.subject()} was {self.pick(ADJECTIVES)}"
        else:
            _, past = self.pick(VERBS)
            text = f"{self.subject()} {self.pick(ADVERBS)} {past} {self.noun_phrase()}"
        if self.rng.random() < 0.3:
            text += f" {self.pick(TIMES)}"
        return text

    def sentence(self) -> str:
        """A sentence: statement, compound, question, quotation or a sentence with numbers."""
        roll = self.rng.random()
        if roll < 0.4:
            body = self.clause()
            return body[0].upper() + body[1:] + "."
        if roll < 0.55:
            joiner = self.pick((", and ", ", but ", " because ", " while ", ", so "))
            body = self.clause() + joiner + self.clause()
            return body[0].upper() + body[1:] + "."
        if roll < 0.65:
            base, _ = self.pick(VERBS)
            return f"Why did {self.subject()} {base} {self.noun_phrase()}?"
        if roll < 0.75:
            said = self.clause()
            said = said[0].upper() + said[1:]
            return f'"{said}," said {self.pick(NAMES)}.'
        if roll < 0.85:
            year = self.rng.randint(1820, 2025)
            count = self.rng.randint(2, 9999)
            _, past = self.pick(INTRANSITIVE)
            return (
                f"In {year}, about {count:,} {plural(self.pick(NOUNS))} {past} "
                f"near {self.pick(PLACES)}."
            )
        if roll < 0.93:
            when = self.pick(CONNECTORS)
            return f"{when}, {self.clause()}."
        return (
            f"{self.pick(NAMES)} measured {self.rng.randint(1, 99)}.{self.rng.randint(0, 9)} "
            f"cm of {self.pick(NOUNS)} and {self.rng.randint(2, 40)}% of the "
            f"{plural(self.pick(NOUNS))} in {self.pick(PLACES)}."
        )

    def document(self) -> str:
        """One document: 1 to 3 paragraphs of 2 to 7 sentences, paragraphs on new lines."""
        paragraphs = []
        for _ in range(self.rng.randint(1, 3)):
            count = self.rng.randint(2, 7)
            paragraphs.append(" ".join(self.sentence() for _ in range(count)))
        return "\n".join(paragraphs)


def generate_documents(seed: int = SEED, count: int = NUM_DOCUMENTS) -> list[str]:
    """The dataset's documents, the same list for the same seed and count."""
    gen = SentenceGenerator(seed)
    return [gen.document() for _ in range(count)]


def dataset_bytes(documents: list[str]) -> bytes:
    """JSON Lines, one ``{"text": ...}`` object a line, UTF-8."""
    lines = [json.dumps({"text": doc}, ensure_ascii=False) for doc in documents]
    return ("\n".join(lines) + "\n").encode("utf-8")


def train_tokenizer(documents: list[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE trained on ``documents``; special tokens take ids 0, 1, 2."""
    # Single-threaded training: the merge order must not depend on thread scheduling.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return tokenizer


def tokenizer_config(tokenizer) -> dict:
    """``tokenizer_config.json`` in the HuggingFace layout TorchTitan 0.2.2 reads."""
    decoder = {}
    for token in SPECIAL_TOKENS:
        decoder[str(tokenizer.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    return {
        "added_tokens_decoder": decoder,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def generate(out: Path) -> list[Path]:
    """Write the dataset and the tokenizer under ``out``; return the files written."""
    documents = generate_documents()
    tokenizer = train_tokenizer(documents)

    dataset_dir = out / "dataset"
    tokenizer_dir = out / "tokenizer"
    dataset_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir.mkdir(parents=True, exist_ok=True)

    written = [
        dataset_dir / "train.jsonl",
        tokenizer_dir / "tokenizer.json",
        tokenizer_dir / "tokenizer_config.json",
    ]
    written[0].write_bytes(dataset_bytes(documents))
    # tokenizer.to_str is the same JSON that Tokenizer.save writes; a trailing newline
    # keeps the file friendly to diff tools.
    written[1].write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    written[2].write_text(
        json.dumps(tokenizer_config(tokenizer), indent=2) + "\n", encoding="utf-8"
    )
    return written


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python scripts/make_assets.py [--out DIR]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT,
        help=f"directory to write tokenizer/ and dataset/ into (default: {DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
