"""Chat prompts for the real model: instruction templates crossed with topics, split into training and held-out
topics (no held-out topic is ever trained on), rendered with a checkpoint's chat template.

    python -m scripts.chat_prompts OUT.jsonl [--split heldout] [--count N]   # JSONL: {"messages": [...]} per line
"""

import argparse
import json
import random
from pathlib import Path
from typing import Any

from parallel_decoding.common.prompts import encode

TEMPLATES = (
    "Explain {} in simple terms.",
    "What is {}? Answer in a short paragraph.",
    "Give me three facts about {}.",
    "Write a short poem about {}.",
    "Why is {} important?",
    "Summarize the history of {} in a few sentences.",
    "What are the advantages and disadvantages of {}?",
    "Explain {} to a ten-year-old.",
    "List five questions a student might ask about {}.",
    "Write a short story that involves {}.",
    "How would you teach someone about {}?",
    "Describe {} in one paragraph.",
    "What are common misconceptions about {}?",
    "Write a tweet about {}.",
    "Give a step-by-step explanation of {}.",
    "Compare {} with something similar and explain the differences.",
)
TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "machine learning", "volcanoes",
    "the human heart", "climate change", "the stock market", "honey bees", "the Roman Empire", "electricity",
    "DNA", "the moon landing", "renewable energy", "the internet", "earthquakes", "vaccines", "gravity",
    "the printing press", "rainforests", "coffee", "chess", "the Olympic Games", "recycling", "the immune system",
    "plate tectonics", "the Great Wall of China", "inflation", "solar panels", "dinosaurs", "the ocean tides",
    "sleep", "music theory", "the Renaissance", "bicycles", "friendship", "time management", "public speaking",
    "healthy eating", "exercise", "the solar system", "magnets", "rainbows", "bread baking", "gardening",
    "the Industrial Revolution", "democracy", "photography", "electric cars", "bird migration", "glaciers",
    "the periodic table", "cloud computing", "cryptography", "the Eiffel Tower", "penguins", "desert ecosystems",
    "nuclear energy", "the Silk Road", "meditation", "video games", "the human brain", "libraries", "trains",
    "the Amazon river", "coral reefs", "antibiotics", "weather forecasting", "the telephone", "mountains",
    "cooking pasta", "learning a new language", "budgeting", "the theory of evolution", "wind turbines",
    "ancient Egypt", "robots", "space telescopes", "volunteering", "soccer", "the piano", "bridges", "tea",
    "writing an essay", "the speed of light", "forests", "smartphones", "the Moon", "insects", "sharks",
    "the Pythagorean theorem", "fractions", "prime numbers", "sorting algorithms", "databases", "open source software",
    "airplanes", "submarines", "the circulatory system", "mushrooms", "snow", "lighthouses", "castles", "maps",
    "clocks", "the alphabet", "paper", "glass", "salt", "rivers", "hurricanes", "the Arctic", "whales", "elephants",
)
CODE_TASKS = (
    "checks whether a number is prime", "reverses a string", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string", "finds the largest element of a list",
    "removes duplicates from a list", "checks whether a string is a palindrome", "merges two sorted lists",
    "computes the greatest common divisor of two numbers", "converts Celsius to Fahrenheit",
    "sums the digits of an integer", "flattens a nested list", "counts word frequencies in a text",
    "returns the second largest number in a list", "checks whether two strings are anagrams",
    "computes the average of a list of numbers", "finds the longest word in a sentence",
    "rotates a list by k positions", "converts a decimal number to binary", "implements binary search",
    "capitalizes the first letter of every word", "checks whether a year is a leap year",
    "computes the power set of a list", "transposes a matrix",
)
HELD_OUT_EVERY = 8  # every 8th topic and coding task is held out


def prompts(split: str = "train") -> list[str]:
    """Every prompt of a split ("train" or "heldout"), in a fixed order."""
    keep = (lambda i: i % HELD_OUT_EVERY == 0) if split == "heldout" else (lambda i: i % HELD_OUT_EVERY != 0)
    topics = [t for i, t in enumerate(TOPICS) if keep(i)]
    tasks = [t for i, t in enumerate(CODE_TASKS) if keep(i)]
    return ([template.format(topic) for topic in topics for template in TEMPLATES]
            + [f"Write a Python function that {task}." for task in tasks])


def sample(split: str, count: int, seed: int = 0) -> list[str]:
    """`count` prompts of a split, drawn without replacement in a fixed order."""
    pool = prompts(split)
    return random.Random(seed).sample(pool, min(count, len(pool)))


def messages(prompt: str) -> list[dict[str, str]]:
    """A prompt as a one-turn chat."""
    return [{"role": "user", "content": prompt}]


def render(tokenizer: Any, prompt: str) -> list[int]:
    """A user message rendered with the tokenizer's chat template, ready for the assistant's answer."""
    return encode(tokenizer, messages(prompt))


def texts(model_dir: Path | str, count: int = 8, split: str = "heldout") -> list[str]:
    """`count` prompts of a split as texts in a checkpoint's chat template, ready for the assistant's answer (the
    bench's, the replay's and the step profile's prompts on the real model)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.apply_chat_template(messages(p), add_generation_prompt=True, tokenize=False)
            for p in sample(split, count)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.chat_prompts", description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--split", choices=("train", "heldout"), default="heldout")
    parser.add_argument("--count", type=int, default=16)
    args = parser.parse_args()
    lines = [json.dumps({"messages": messages(p)}) for p in sample(args.split, args.count)]
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
