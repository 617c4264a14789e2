"""serve --chat-template and --chat-template-file: the format the operator
names (or gives as a template file) is the one chats are rendered in. Each
check compares a greedy chat with a completion of the same conversation
written out by hand in that format, on the same server: the same prompt
tokens and the same text. Bad values stop the server before the model loads,
with exit 2 and a message that names the flag."""
import os
import subprocess

import pytest

from conftest import chatml

MESSAGES = [{"role": "system", "content": "Answer in one short sentence."},
            {"role": "user", "content": "What colour is the sky on a clear day?"}]


def llama3(messages):
    """Llama-3's turns, written out independently of api/chat_template.c."""
    out = ""
    for m in messages:
        out += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
    return out + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def gemma(messages):
    """Gemma's turns: a leading system message opens the first user turn."""
    sys = messages[0]["content"] + "\n\n" if messages[0]["role"] == "system" else ""
    out = ""
    for m in messages[1 if sys else 0:]:
        role = "model" if m["role"] == "assistant" else "user"
        out += f"<start_of_turn>{role}\n{sys}{m['content']}<end_of_turn>\n"
        sys = ""
    return out + "<start_of_turn>model\n"


def chat_and_completion(server, rendered, max_tokens=16):
    c = server.client()
    chat = c.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=max_tokens,
                                     temperature=0)
    comp = c.completions.create(model="smol", prompt=rendered, max_tokens=max_tokens,
                                temperature=0)
    return chat, comp


def prompt_tokens(server, text):
    return server.client().completions.create(model="smol", prompt=text, max_tokens=1,
                                              temperature=0).usage.prompt_tokens


@pytest.mark.parametrize("name,render", [("llama3", llama3), ("gemma", gemma)])
def test_a_named_format_renders_chats_in_it(start_server, name, render):
    s = start_server("--model-alias", "smol", "--chat-template", name)
    chat, comp = chat_and_completion(s, render(MESSAGES))
    assert chat.usage.prompt_tokens == comp.usage.prompt_tokens
    assert chat.choices[0].message.content == comp.choices[0].text
    # the model's own ChatML would be a different prompt: the flag took effect
    assert chat.usage.prompt_tokens != prompt_tokens(s, chatml(MESSAGES))
    assert f"chat {name} from --chat-template)" in s.log()
    assert "chat messages are rendered as ChatML" not in s.log()


def test_chatml_by_name_has_no_default_system_turn(start_server):
    """SmolLM2's GGUF template adds its own system turn when a chat has none;
    the bare name carries no template, so no such turn."""
    s = start_server("--model-alias", "smol", "--chat-template", "chatml")
    user_only = MESSAGES[1:]
    c = s.client()
    chat = c.chat.completions.create(model="smol", messages=user_only, max_tokens=8,
                                     temperature=0)
    assert chat.usage.prompt_tokens == prompt_tokens(s, chatml(user_only, default_system=False))
    assert chat.usage.prompt_tokens < prompt_tokens(s, chatml(user_only))


def test_a_template_file_is_recognized_as_the_models_would_be(start_server, tmp_path):
    f = tmp_path / "gemma.jinja"
    # the shape of a Gemma template: its turn markers inside Jinja
    f.write_text("{{ bos_token }}{% for message in messages %}"
                 "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
                 "'<end_of_turn>\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")
    s = start_server("--model-alias", "smol", "--chat-template-file", str(f))
    chat, comp = chat_and_completion(s, gemma(MESSAGES))
    assert chat.usage.prompt_tokens == comp.usage.prompt_tokens
    assert chat.choices[0].message.content == comp.choices[0].text
    assert "chat gemma from --chat-template-file)" in s.log()


def test_a_default_system_prompt_too_long_to_keep_is_dropped_with_a_warning(start_server,
                                                                           tmp_path):
    """A ChatML template whose default system prompt is longer than the
    server keeps: chats without a system message get none, and the log says
    so; the prompt was cut at 511 bytes, here inside a character."""
    f = tmp_path / "long-default.jinja"
    default = "\u00e9" * 3000  # 6,000 bytes
    f.write_text("{% if messages[0]['role'] != 'system' %}"
                 "{{ '<|im_start|>system\\n" + default + "<|im_end|>\\n' }}{% endif %}"
                 "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>\\n' }}{% endfor %}")
    s = start_server("--model-alias", "smol", "--chat-template-file", str(f))
    user_only = [{"role": "user", "content": "Hi"}]
    chat = s.client().chat.completions.create(model="smol", messages=user_only, max_tokens=1,
                                              temperature=0)
    assert chat.usage.prompt_tokens == prompt_tokens(s, chatml(user_only, default_system=False))
    assert "default system prompt (6000 bytes) is longer than the 4095" in s.log(), s.log()


def refused(binary, model, *args):
    r = subprocess.run([binary, "serve", "-m", model, "--port", "0", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "listening on" not in r.stderr + r.stdout
    assert "loading" not in r.stderr + r.stdout  # refused before the model loads
    return r.stderr


def test_bad_chat_template_flags_stop_the_server_before_the_model_loads(binary, model, tmp_path):
    assert "--chat-template expects auto, chatml, llama3, llama2 or gemma, got 'jinja'" in \
        refused(binary, model, "--chat-template", "jinja")
    assert "give one" in refused(binary, model, "--chat-template", "gemma",
                                 "--chat-template-file", "/etc/hostname")
    missing = str(tmp_path / "missing.jinja")
    assert f"--chat-template-file {missing}: No such file or directory" in \
        refused(binary, model, "--chat-template-file", missing)
    assert f"--chat-template-file {tmp_path}: Is a directory" in \
        refused(binary, model, "--chat-template-file", str(tmp_path))
    unknown = tmp_path / "unknown.jinja"
    unknown.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    assert "not a template streamsink can render" in \
        refused(binary, model, "--chat-template-file", str(unknown))
    config = tmp_path / "tokenizer_config.json"  # the whole file, not its template
    config.write_text('{\n  "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\\n'
                      '{{ m.content }}<|im_end|>\\n{% endfor %}"\n}')
    assert "is a JSON object" in refused(binary, model, "--chat-template-file", str(config))
    big = tmp_path / "big.jinja"
    with open(big, "wb") as fh:  # a real marker, past the size bound
        fh.write(b"<|im_start|>" + b" " * (1 << 20))
    assert "is larger than 1048576 bytes" in refused(binary, model, "--chat-template-file",
                                                     str(big))
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.jinja"
        locked.write_text("<|im_start|>")
        locked.chmod(0)
        assert "Permission denied" in refused(binary, model, "--chat-template-file", str(locked))
