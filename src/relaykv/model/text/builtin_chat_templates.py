"""Chat templates for model families whose packaged files carry none.

The packaged Gemma-3-270M GGUF has no `tokenizer.chat_template`, so without this chat would
fall back to `role: content` lines, which Gemma continues as plain text (`" Say
hello.robot:"`). `GEMMA3` is the template of Gemma-3's `tokenizer_config.json` (the format
the model card documents: `<start_of_turn>user ... <end_of_turn>`, the assistant as `model`,
a system message prefixed to the first user turn). Gemma-3's generation config ends a turn
at `<end_of_turn>` (id 106) as well as `<eos>`; `stop_tokens` names it so the server stops
there (docs/serving.md "Chat templates").
"""

from __future__ import annotations

GEMMA3 = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate '
    'user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

# architecture (GGUF `general.architecture`, HF `model_type`) -> (template, stop token texts)
BUILTIN: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemma3": (GEMMA3, ("<end_of_turn>",)),
    "gemma3_text": (GEMMA3, ("<end_of_turn>",)),
}
