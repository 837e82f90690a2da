
€{"model": {"n_layer": 1, "n_embd": 8, "n_head": 2}, "latchkey": {"steps": 1, "world_size": 1, "data": {"tokens_file": "t.bin"}}}/tmph ¼æ