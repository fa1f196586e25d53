"""The tool-call tests' tool, questions and requests, both engines' (OpenAI servers)."""

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}]
QUESTIONS = ["What's the weather in Paris?", "Is it cold in Oslo today?", "Should I take an umbrella in Lima?"]
CHOICES = [{"type": "function", "function": {"name": "get_weather"}}, "required"]


def calls(client, choices: list = CHOICES) -> list[tuple[str, str, str, str]]:
    """Per question and tool choice: (name, arguments) not streamed, then (name, arguments) joined from the
    streamed deltas."""
    out = []
    for question, choice in ((q, c) for q in QUESTIONS for c in choices):
        request = {"model": "tiny", "messages": [{"role": "user", "content": question}], "tools": TOOLS,
                   "tool_choice": choice, "max_tokens": 96, "temperature": 0}
        call = client.chat.completions.create(**request).choices[0].message.tool_calls[0].function
        name = arguments = ""
        for chunk in client.chat.completions.create(**request, stream=True):
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                name += delta.function.name or ""
                arguments += delta.function.arguments or ""
        out.append((call.name, call.arguments, name, arguments))
    return out
