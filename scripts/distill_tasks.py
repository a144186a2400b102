"""Chat task families for ``make_distill_prompts.py``: the kinds of request people type into a chat app, each
phrased several ways over its own pool of subjects, so the draft sees the target answer many tasks, not many
wordings of one.

The prompts the target wrote itself (``distill-self.jsonl``) are nearly all one kind, a request for advice
("I'm considering a career change...")."""

from __future__ import annotations

import random

from distill_pools import (
    ANIMAL_HABITS,
    BUSINESSES,
    CAUSES,
    CODE_TASKS,
    COMPARE_PAIRS,
    COUNTRIES,
    DEVICES,
    EMAILS,
    FACT_QUESTIONS,
    FIX_SENTENCES,
    HOBBIES,
    LANGUAGES,
    LIST_REQUESTS,
    PHENOMENA,
    PHRASES,
    PROGRAMMING_PAIRS,
    STORIES,
    TOPICS,
    TOWNS,
    WORDS,
)

AUDIENCES = ["a ten-year-old", "a beginner", "my grandmother", "a high-school student", "someone who has never "
             "heard of it", "a busy manager", "a curious child", "an adult learner"]
CODE_LANGS = ["Python", "Python", "Python", "JavaScript", "Java", "C", "Go", "Rust", "a shell script", "SQL"]
FORMS = ["haiku", "short poem", "limerick", "four-line rhyme", "very short story", "short song verse"]
NUMBERS = ["two", "three", "four", "five", "six", "seven"]
CONCISE = ["You are a concise assistant. Answer in one short paragraph.", "Answer in at most three sentences.",
           "You are a helpful assistant.", "You are a friendly expert who explains things clearly.",
           "Keep your answers brief and to the point.", "You are a patient teacher."]
GUIDES = ["You are a friendly travel guide.", "You are an enthusiastic local guide.",
          "You are a travel agent who plans short trips."]


def pick(rng: random.Random, options: list[str]) -> str:
    return options[rng.randrange(len(options))]


def explain(rng: random.Random) -> str:
    thing, who = pick(rng, PHENOMENA), pick(rng, AUDIENCES)
    return pick(rng, [f"Explain in a few sentences why {thing}.", f"How come {thing}?",
                      f"Can you explain why {thing}?", f"Explain to {who} why {thing}.",
                      f"What is the reason {thing}?", f"In short, how come {thing}?"])


def how_it_works(rng: random.Random) -> str:
    device, who = pick(rng, DEVICES), pick(rng, AUDIENCES)
    return pick(rng, [f"Describe how {device} works to {who}.", f"How does {device} work?",
                      f"Explain how {device} works in simple terms.", f"What happens inside {device}?",
                      f"Give a short explanation of how {device} works."])


def creative(rng: random.Random) -> str:
    topic, form = pick(rng, TOPICS), pick(rng, FORMS)
    return pick(rng, [f"Write a {form} about {topic}.", f"Can you write a {form} about {topic}?",
                      f"Compose a {form} about {topic}.", f"I'd love a {form} about {topic}."])


def tips(rng: random.Random) -> str:
    hobby, n = pick(rng, HOBBIES), pick(rng, NUMBERS)
    return pick(rng, [f"Give me {n} tips for {hobby}.", f"What are {n} good tips for {hobby}?",
                      f"I want to get better at {hobby}. Any advice?", f"How do I start {hobby}?",
                      f"What are the most common mistakes when {hobby}?", f"List {n} ways to improve at {hobby}."])


def listing(rng: random.Random) -> str:
    request, n = pick(rng, LIST_REQUESTS), pick(rng, NUMBERS[1:])
    return pick(rng, [f"List {n} {request}.", f"Name {n} {request}.", f"Can you give me {n} {request}?",
                      f"What are {n} {request}?"])


def code(rng: random.Random) -> str:
    task, lang = pick(rng, CODE_TASKS), pick(rng, CODE_LANGS)
    return pick(rng, [f"Write a {lang} function that {task}.", f"How do I write code in {lang} that {task}?",
                      f"Show me {lang} code that {task}.", f"Write a short {lang} program that {task}.",
                      f"Can you write a function that {task}? Use {lang}."])


def programming_difference(rng: random.Random) -> str:
    a, b = pick(rng, PROGRAMMING_PAIRS)
    return pick(rng, [f"What is the difference between {a} and {b}?", f"When should I use {a} instead of {b}?",
                      f"Compare {a} and {b}.", f"Explain {a} versus {b} with an example."])


def compare(rng: random.Random) -> str:
    a, b = pick(rng, COMPARE_PAIRS)
    return pick(rng, [f"What is the difference between {a} and {b}?", f"How are {a} and {b} different?",
                      f"Compare {a} and {b} in a few sentences.", f"Is there a difference between {a} and {b}?"])


def arithmetic(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 99), rng.randint(2, 24), rng.randint(5, 95)
    return pick(rng, [f"How many hours are there in {b} days? Show your working.",
                      f"What is {c}% of {a * 10}? Show your working.",
                      f"A shirt costs {a} dollars and is {c}% off. What is the new price?",
                      f"If {b} friends share {a * b} sweets equally, how many does each get?",
                      f"What is {a} multiplied by {b}? Explain the steps.",
                      f"How many seconds are in {b} hours? Show your working.",
                      f"A car drives at {a} km per hour for {b} hours. How far does it go?",
                      f"I read {b} pages a day. How long will a {a * b} page book take me?",
                      f"What is the sum of the numbers from 1 to {a}?",
                      f"Convert {a} kilograms to pounds and show how."])


def translate(rng: random.Random) -> str:
    phrase = pick(rng, PHRASES)
    first, second = rng.sample(LANGUAGES, 2)
    return pick(rng, [f"Translate '{phrase}' into {first} and {second}.", f"How do you say '{phrase}' in {first}?",
                      f"Translate '{phrase}' into {first}.", f"What is '{phrase}' in {first} and in {second}?"])


def naming(rng: random.Random) -> str:
    business = pick(rng, BUSINESSES)
    return pick(rng, [f"Suggest a name for {business}.", f"Give me three name ideas for {business}.",
                      f"What would be a catchy name for {business}?", f"Write a slogan for {business}."])


def summarize(rng: random.Random) -> str:
    story = pick(rng, STORIES)
    return pick(rng, [f"Summarize the plot of {story} in a short paragraph.", f"What happens in {story}?",
                      f"Give me a two-sentence summary of {story}.", f"Who are the main characters in {story}?",
                      f"What is the main message of {story}?"])


def causes(rng: random.Random) -> str:
    issue = pick(rng, CAUSES)
    return pick(rng, [f"What are the main causes of {issue}?", f"Why does {issue} happen?",
                      f"How can we reduce {issue}?", f"What are the effects of {issue}?"])


def animal(rng: random.Random) -> str:
    return pick(rng, [f"Why do {pick(rng, ANIMAL_HABITS)}?", f"Why do {pick(rng, ANIMAL_HABITS)}? Keep it short."])


def fact(rng: random.Random) -> str:
    return pick(rng, FACT_QUESTIONS)


def country(rng: random.Random) -> str:
    place = pick(rng, COUNTRIES)
    return pick(rng, [f"What is the capital of {place}?", f"What language do people speak in {place}?",
                      f"Tell me three facts about {place}.", f"What is {place} famous for?",
                      f"What is the weather like in {place}?", f"What food should I try in {place}?"])


def words(rng: random.Random) -> str:
    word = pick(rng, WORDS)
    return pick(rng, [f"What does the word '{word}' mean?", f"Use the word '{word}' in a sentence.",
                      f"Give me a synonym for '{word}'.", f"Define '{word}' and give an example."])


def edit(rng: random.Random) -> str:
    sentence = pick(rng, FIX_SENTENCES)
    return pick(rng, [f"Correct the grammar in this sentence: '{sentence}'",
                      f"Rewrite this sentence to sound more formal: '{sentence}'",
                      f"Make this sentence clearer: '{sentence}'"])


def email(rng: random.Random) -> str:
    return f"Write a short email {pick(rng, EMAILS)}."


SINGLE = [explain, how_it_works, creative, tips, listing, code, code, programming_difference, compare, arithmetic,
          translate, naming, summarize, causes, animal, fact, fact, country, words, edit, email]


def travel(rng: random.Random) -> dict:
    town = pick(rng, TOWNS)
    question = pick(rng, [f"What should I see on a one-day visit to {town}?", f"Plan a two-day trip to {town} for me.",
                          f"What is the best time of year to visit {town}?", f"What should I eat in {town}?"])
    return {"messages": [{"role": "system", "content": pick(rng, GUIDES)}, {"role": "user", "content": question}]}


def learn(rng: random.Random) -> dict:
    hobby = pick(rng, HOBBIES)
    return {"messages": [
        {"role": "user", "content": f"I want to get into {hobby}."},
        {"role": "assistant", "content": pick(rng, ["Great idea! What would you like to focus on?",
                                                    "Wonderful! How much time can you spend on it?",
                                                    "That sounds fun. Have you tried it before?"])},
        {"role": "user", "content": pick(rng, ["I'm a complete beginner. What should I do first?",
                                               "About an hour a day. Where do I start?",
                                               "Only a little. What should I practise next?"])}]}


def task_prompt(rng: random.Random) -> dict:
    """One chat prompt: a single request, sometimes under a system prompt, or a short conversation."""
    kind = rng.random()
    if kind < 0.06:
        return travel(rng)
    if kind < 0.12:
        return learn(rng)
    text = pick(rng, SINGLE)(rng)
    if kind < 0.3:
        return {"messages": [{"role": "system", "content": pick(rng, CONCISE)}, {"role": "user", "content": text}]}
    return {"prompt": text}
