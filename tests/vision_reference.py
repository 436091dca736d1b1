"""What the vision-language tests share: the tiny random Idefics3 they compare with transformers
(a 2-layer SigLIP-style tower over 4 x 4 patches of 8 pixels, pixel shuffle 2, so 4
placeholders per image, and a 2-layer Llama), and a SmolVLM-style tokenizer and chat template.
"""

import json

import torch
import transformers
from PIL import Image
from reference import randomize

import hone
from hone.tokenizer import Tokenizer, byte_level_backend

IMAGE = 96  # the <image> placeholder id of the tiny Idefics3 (its vocabulary's last id)
FAKE = 95  # <fake_token_around_image>: an ordinary text token to the model
PER_IMAGE = 4  # (32 / 8) ** 2 patches / 2 ** 2

# A SmolVLM-style template: parts rendered in order, <image> for each image part.
TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}: {{ message['content'] }}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}:{% else %}: {% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}<image>{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")


def vlm_tokenizer(grid: int = 4) -> Tokenizer:
    """hone's byte-level tokenizer with SmolVLM's image tokens (tiles up to grid x grid) and
    TEMPLATE."""
    specials = (["<|im_start|>", "<end_of_utterance>", "<image>", "<fake_token_around_image>",
                 "<global-img>"] +
                [f"<row_{r}_col_{c}>" for r in range(1, grid + 1) for c in range(1, grid + 1)])
    return Tokenizer(byte_level_backend(specials), eos_token="<end_of_utterance>",
                     chat_template=TEMPLATE)


def idefics3_config(tie: bool = False, vocab_size: int = 97, image_token_id: int = IMAGE,
                    vision_layers: int = 2, max_positions: int = 64):
    config = transformers.Idefics3Config(
        vision_config=dict(hidden_size=32, intermediate_size=48,
                           num_hidden_layers=vision_layers, num_attention_heads=4,
                           image_size=32, patch_size=8),
        text_config=dict(model_type="llama", vocab_size=vocab_size, hidden_size=48,
                         intermediate_size=80, num_hidden_layers=2, num_attention_heads=3,
                         num_key_value_heads=1, head_dim=16,
                         max_position_embeddings=max_positions, rope_theta=1e5),
        scale_factor=2, image_token_id=image_token_id, tie_word_embeddings=tie)
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "eager"
    return config


def build_idefics3(folder, config, randomized: bool = True):
    """(transformers' model of `config`, seeded and, by default, with every weight randomized;
    hone's model of the folder it was saved to)."""
    torch.manual_seed(0)
    ref = transformers.Idefics3ForConditionalGeneration(config).to(torch.float32)
    if randomized:
        randomize(ref)
    ref.eval()
    ref.save_pretrained(str(folder))
    return ref, hone.load_model(folder, dtype="float32")


COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 50, 230)}


def smolvlm_folder(out):
    """A tiny Idefics3 folder as training reads it: weights and config by transformers (seeded,
    not randomized), vlm_tokenizer(grid=2), 32-pixel tiles of 4 placeholders (8-pixel patches,
    pixel shuffle 2), images first resized to 64 pixels a side at most."""
    tok = vlm_tokenizer(grid=2)
    tok.save(out)
    config = idefics3_config(vocab_size=tok.vocab_size, vision_layers=1, max_positions=256,
                             image_token_id=tok.encode("<image>", add_special_tokens=False)[0])
    torch.manual_seed(0)
    transformers.Idefics3ForConditionalGeneration(config).save_pretrained(str(out))
    (out / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"longest_edge": 64}, "max_image_size": {"longest_edge": 32},
         "do_image_splitting": True}))
    (out / "processor_config.json").write_text(json.dumps({"image_seq_len": 4}))
    return out


def colour_images(folder) -> dict[str, str]:
    """Solid images of each colour, two sizes (a 2 x 2 split plus the global view, or one frame
    when it fits a tile), written under folder/img: {name+size: relative path}."""
    (folder / "img").mkdir(exist_ok=True)
    out = {}
    for k, (name, rgb) in enumerate(COLOURS.items()):
        for size in (20, 50):
            Image.new("RGB", (size, size + k), rgb).save(folder / "img" / f"{name}{size}.png")
            out[f"{name}{size}"] = f"img/{name}{size}.png"
    return out
