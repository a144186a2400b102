"""Write ``assets/prompts/distill.jsonl``: the hand-written distillation prompts, the prompts the target wrote
itself (``distill-self.jsonl``, from ``make_self_prompts.py``), seeded template prompts, then seeded prompts of
the chat task families in ``distill_tasks.py`` (appended last, so the earlier lines and their cached replies stay).

The draft is trained on the target's replies to these prompts, so they should look like chat: questions,
explanations, advice, lists, stories and poems, code, arithmetic, comparisons, with and without a system
prompt. Nothing here may repeat the held-out benchmark set (``chat.jsonl``): prompts that mention one of
its subjects are dropped. Deterministic: ``python scripts/make_distill_prompts.py`` always writes the same file.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

from distill_tasks import task_prompt

PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts"
HANDWRITTEN = PROMPTS / "distill-handwritten.jsonl"
SELF_WRITTEN = PROMPTS / "distill-self.jsonl"
OUT = PROMPTS / "distill.jsonl"
log = logging.getLogger("make_distill_prompts")
NUM_TEMPLATED = 500
NUM_TASKS = 2500
SEED = 0
TASKS_SEED = 1

# Subjects of the held-out prompts: a templated prompt mentioning one of them is dropped.
HELD_OUT_SUBJECTS = ("france", "sky", "blue", "autumn", "sleep", "palindrome", "tuple", "romeo", "juliet",
                     "minutes", "week", "good morning", "bakery", "sourdough", "inflation", "bicycle", "vitamin",
                     "purr", "cook", "italian", "rome")

SCIENCE = ["gravity", "photosynthesis", "electricity", "magnetism", "the water cycle", "evolution", "DNA",
           "atoms", "the immune system", "climate change", "volcanoes", "tides", "rainbows", "sound waves",
           "friction", "the greenhouse effect", "black holes", "the speed of light", "batteries", "solar panels",
           "the human heart", "the brain", "digestion", "plate tectonics", "the seasons", "clouds", "lightning",
           "antibiotics", "viruses", "the periodic table", "nuclear energy", "wind turbines", "the Moon's phases",
           "erosion", "fossils", "the ozone layer", "static electricity", "hurricanes", "the nervous system"]
TECH = ["the internet", "a computer's memory", "a search engine", "machine learning", "a database", "Wi-Fi",
        "GPS", "a compiler", "cloud computing", "email", "a web browser", "encryption", "a smartphone camera",
        "an operating system", "open source software", "a password manager", "version control with git",
        "a spreadsheet", "a microwave oven", "a 3D printer", "electric cars", "a touchscreen", "QR codes",
        "video compression", "a neural network", "blockchains", "an API", "unit tests", "recursion"]
EVERYDAY = ["saving money", "learning a new language", "staying focused", "running a first marathon",
            "keeping a houseplant alive", "writing a good email", "starting a vegetable garden", "moving to a new city",
            "preparing for a job interview", "reducing stress", "drinking more water", "organising a small party",
            "learning to swim", "training a puppy", "making new friends", "reading more books", "public speaking",
            "keeping a tidy desk", "planning a road trip", "starting to exercise", "learning the guitar",
            "writing a CV", "studying for exams", "eating more vegetables", "taking better photos",
            "budgeting for a holiday", "working from home", "getting up early", "learning to draw"]
NATURE = ["the ocean", "a mountain lake", "the first snow", "a thunderstorm", "a desert at night", "spring rain",
          "a quiet forest", "the full moon", "a river", "a sunrise", "a city at night", "an old oak tree",
          "the stars", "a winter morning", "a garden", "the wind", "a lighthouse", "a summer evening"]
ANIMALS = ["dolphins", "bees", "owls", "elephants", "penguins", "octopuses", "wolves", "ants", "whales",
           "parrots", "horses", "bats", "frogs", "sharks", "butterflies", "dogs", "camels", "tortoises"]
PLACES = ["Japan", "Egypt", "Brazil", "Canada", "Kenya", "Norway", "India", "Australia", "Mexico", "Peru",
          "Iceland", "Vietnam", "Morocco", "Greece", "Scotland", "Chile", "Thailand", "Portugal", "Turkey"]
HISTORY = ["the Industrial Revolution", "the printing press", "the Roman Empire", "the Renaissance",
           "the first Moon landing", "the invention of the telephone", "the Silk Road", "ancient Egypt",
           "the French Revolution", "the fall of the Berlin Wall", "the Olympic Games", "the Vikings",
           "the invention of writing", "the age of exploration", "the first computers", "the Great Depression"]
FOODS = ["pancakes", "a vegetable soup", "fried rice", "a fruit salad", "banana bread", "hummus", "an omelette",
         "a curry", "guacamole", "a smoothie", "lentil stew", "roast potatoes", "a chocolate cake", "dumplings"]
CODE_TASKS = ["reverses a list", "counts the vowels in a string", "returns the largest number in a list",
              "checks whether a number is even", "computes the factorial of n", "returns the n-th Fibonacci number",
              "removes duplicates from a list", "sorts a list of words by length", "counts words in a sentence",
              "converts Celsius to Fahrenheit", "finds the average of a list of numbers", "merges two dictionaries",
              "checks whether a year is a leap year", "returns the second smallest element of a list",
              "flattens a list of lists", "capitalises the first letter of every word", "computes a GCD",
              "checks whether two strings are anagrams", "reads a text file and counts its lines",
              "finds all prime numbers below n", "converts a binary string to an integer", "sums the digits of n"]
LANGS = ["Python", "JavaScript"]
PEOPLE = ["a five-year-old", "a teenager", "a beginner", "a grandparent", "a busy student", "a scientist"]
JOBS = ["a nurse", "a software engineer", "a teacher", "a chef", "a pilot", "a farmer", "an architect",
        "a librarian", "a firefighter", "a journalist", "an electrician", "a dentist", "a musician"]
SYSTEMS = ["You are a helpful assistant.", "You are a concise assistant. Answer in one or two sentences.",
           "You are a patient teacher who explains things to children.", "You are a friendly travel guide.",
           "You are an expert programmer. Keep answers short and show code.", "You are a cheerful chef.",
           "You are a careful science tutor.", "You are a kind and practical life coach."]

TEMPLATES = [
    ("What is {s}?", SCIENCE + TECH), ("How does {s} work?", SCIENCE + TECH), ("Explain {s} simply.", SCIENCE + TECH),
    ("Explain {s} to {p}.", SCIENCE + TECH, PEOPLE), ("Why is {s} important?", SCIENCE + TECH + HISTORY),
    ("Give me three facts about {s}.", SCIENCE + ANIMALS + PLACES + HISTORY),
    ("Tell me something surprising about {s}.", ANIMALS + PLACES + SCIENCE),
    ("What are the advantages and disadvantages of {s}?", TECH),
    ("Give me some tips for {s}.", EVERYDAY), ("How do I get better at {s}?", EVERYDAY),
    ("What mistakes do people make when {s}?", EVERYDAY), ("Make a short plan for {s}.", EVERYDAY),
    ("Write a short poem about {s}.", NATURE + ANIMALS), ("Write a haiku about {s}.", NATURE + ANIMALS),
    ("Write a very short story about {s}.", NATURE + ANIMALS + JOBS),
    ("Write a limerick about {s}.", ANIMALS + JOBS), ("Describe {s} in a few sentences.", NATURE + PLACES),
    ("What should I see on a trip to {s}?", PLACES), ("What is the food like in {s}?", PLACES),
    ("What is the capital of {s}?", PLACES), ("What language is spoken in {s}?", PLACES),
    ("Summarize {s} in a short paragraph.", HISTORY), ("Why did {s} matter?", HISTORY),
    ("What can we learn from {s}?", HISTORY), ("How do I make {s}?", FOODS),
    ("Give me a simple recipe for {s}.", FOODS), ("Is {s} healthy?", FOODS),
    ("Write a {l} function that {s}.", CODE_TASKS, LANGS), ("How would you write code that {s}?", CODE_TASKS),
    ("What does a day in the life of {s} look like?", JOBS), ("What skills does {s} need?", JOBS),
    ("How do I become {s}?", JOBS), ("List five interesting things about {s}.", ANIMALS + PLACES),
    ("Compare {s} and {t}.", ANIMALS), ("What is the difference between {s} and {t}?", SCIENCE + TECH),
]

ARITHMETIC = [
    "What is {a} times {b}?", "What is {a} plus {b}? Explain your steps.", "If I have {a} apples and eat {b}, "
    "how many are left?", "A train travels {a} kilometres in {b} hours. What is its average speed?",
    "If a book costs {a} dollars and I buy {b} of them, how much do I pay?",
    "How many seconds are there in {b} hours? Show your working.", "What is {a} divided by {b}?",
]
FOLLOW_UPS = [("Can you give me an example?",), ("Can you make it shorter?",), ("Why is that?",),
              ("What else should I know?",), ("Can you explain that more simply?",)]


def templated(rng: random.Random) -> dict:
    kind = rng.random()
    if kind < 0.1:
        a, b = rng.randint(2, 999), rng.randint(2, 60)
        text = rng.choice(ARITHMETIC).format(a=max(a, b), b=min(a, b))
    else:
        template, *pools = rng.choice(TEMPLATES)
        s = rng.choice(pools[0])
        extra = rng.choice(pools[1]) if len(pools) > 1 else None
        t = rng.choice([x for x in pools[0] if x != s])
        text = template.format(s=s, t=t, p=extra, l=extra)
        text = text[0].upper() + text[1:]
    if kind > 0.85:  # a multi-turn conversation: a first reply, then a follow-up
        first = "Sure. " + rng.choice(["Here is a short answer.", "Let me explain.", "Good question."])
        return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": first},
                             {"role": "user", "content": rng.choice(FOLLOW_UPS)[0]}]}
    if kind > 0.6:
        return {"messages": [{"role": "system", "content": rng.choice(SYSTEMS)}, {"role": "user", "content": text}]}
    return {"prompt": text}


def main() -> None:
    lines = [line for path in (HANDWRITTEN, SELF_WRITTEN) if path.is_file()
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    seen = set(lines)
    made = 0
    for make, count, seed in ((templated, NUM_TEMPLATED, SEED), (task_prompt, NUM_TASKS, TASKS_SEED)):
        rng, made = random.Random(seed), 0
        while made < count:
            line = json.dumps(make(rng))
            if line in seen or any(word in line.lower() for word in HELD_OUT_SUBJECTS):
                continue
            seen.add(line)
            lines.append(line)
            made += 1
    OUT.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    log.info("wrote %d prompts to %s", len(lines), OUT)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
