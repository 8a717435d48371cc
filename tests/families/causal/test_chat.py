"""Chat templates: rendered as transformers' apply_chat_template renders them, from every place a
folder keeps one, and a hostile template reaches no Python object or file."""

from __future__ import annotations

import json

import pytest

from edgeattn.runtime.families.causal.chat import ChatTemplateError, load_chat_template

pytestmark = pytest.mark.quick
transformers = pytest.importorskip("transformers")

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
HEADERS = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{% set content = message['content'] | trim %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + content + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
#: block tags on lines of their own: trim_blocks and lstrip_blocks decide what the output holds
INST = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] == 'system' %}
        {% continue %}
    {% endif %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 1) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message['role'] == 'user' %}
        {{ '[INST] ' + message['content'] + ' [/INST]' }}
    {% elif message['role'] == 'assistant' %}
        {{ message['content'] + eos_token }}
    {% endif %}
{% endfor %}
"""
TOOLS = (
    "{% if tools %}{{ 'Tools: ' + (tools | tojson) + '\\n' }}{% endif %}"
    "{% for message in messages %}{{ message['role'] | upper }}: {{ message['content'] }}\n"
    "{% if loop.index >= 3 %}{% break %}{% endif %}{% endfor %}{{ strftime_now('%Y') }}"
)
MESSAGES = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "Héllo 世界, how are you?"},
    {"role": "assistant", "content": "Fine."},
    {"role": "user", "content": "And the sea?"},
]
TOOL = [{"type": "function", "function": {"name": "météo", "parameters": {"type": "object"}}}]


def _folder(tmp_path, template, name="tok"):
    from tests.helpers.encoder_folders import ROBERTA_SPECIALS, make_tokenizer

    tok = make_tokenizer(*ROBERTA_SPECIALS)
    tok.bos_token, tok.eos_token = "<s>", "</s>"
    tok.chat_template = template
    tok.save_pretrained(tmp_path / name)
    return tok, tmp_path / name


@pytest.mark.parametrize("template", [CHATML, HEADERS, INST, TOOLS], ids=["chatml", "headers", "inst", "tools"])
@pytest.mark.parametrize("prompt", [False, True])
def test_rendered_as_transformers_renders_it(tmp_path, template, prompt):
    tok, folder = _folder(tmp_path, template)
    assert (folder / "chat_template.jinja").is_file()  # as transformers saves a single template
    ours = load_chat_template(folder)
    tools = TOOL if template is TOOLS else None
    expected = tok.apply_chat_template(MESSAGES, tools=tools, tokenize=False, add_generation_prompt=prompt)
    assert ours.render(MESSAGES, add_generation_prompt=prompt, tools=tools) == expected
    assert ours.special_tokens["bos_token"] == "<s>" and ours.special_tokens["eos_token"] == "</s>"


def test_every_place_a_folder_keeps_its_template(tmp_path):
    tok, folder = _folder(tmp_path, HEADERS)
    expected = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for value in (HEADERS, [{"name": "default", "template": HEADERS}, {"name": "tool_use", "template": TOOLS}]):
        config["chat_template"] = value
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        assert load_chat_template(folder).render(MESSAGES, add_generation_prompt=True) == expected
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template(folder) is None
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": HEADERS}))
    assert load_chat_template(folder).render(MESSAGES, add_generation_prompt=True) == expected


def test_the_templates_own_errors_are_one_error_naming_it(tmp_path):
    _, folder = _folder(tmp_path, INST)
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja failed: Conversation roles must alternate"):
        load_chat_template(folder).render(bad)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(ChatTemplateError, match="is not a valid Jinja template"):
        load_chat_template(folder).render(MESSAGES)


@pytest.mark.parametrize(
    "template, refused",
    [
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "refused by the sandbox"),
        ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "refused by the sandbox"),
        ("{{ raise_exception.__globals__ }}", "refused by the sandbox"),
        ("{{ messages.append({'role': 'system', 'content': 'x'}) }}", "refused by the sandbox"),
        ("{% include '/etc/passwd' %}", "failed"),
        ("{% for i in range(10 ** 9) %}{{ i }}{% endfor %}", "failed"),
        ("{% for i in range(99999) %}{{ 'x' * 1000 }}{% endfor %}", "characters; it was stopped"),
    ],
    ids=["subclasses", "globals", "function-globals", "mutation", "include", "range", "flood"],
)
def test_a_hostile_template_reaches_no_python_object_or_file(tmp_path, template, refused):
    folder = tmp_path / "hostile"
    folder.mkdir()
    (folder / "chat_template.jinja").write_text(template)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError, match=refused):
        load_chat_template(folder).render(messages)
    assert messages == [{"role": "user", "content": "hi"}]
