"""English language names Whisper users pass (``language="german"``) -> the language code of the token
(``<|de|>``).  Codes themselves are always accepted; the model's ``lang_to_id`` decides what it supports."""

LANGUAGE_CODES = {
    "english": "en", "chinese": "zh", "german": "de", "spanish": "es", "russian": "ru", "korean": "ko",
    "french": "fr", "japanese": "ja", "portuguese": "pt", "turkish": "tr", "polish": "pl", "catalan": "ca",
    "dutch": "nl", "arabic": "ar", "swedish": "sv", "italian": "it", "indonesian": "id", "hindi": "hi",
    "finnish": "fi", "vietnamese": "vi", "hebrew": "he", "ukrainian": "uk", "greek": "el", "malay": "ms",
    "czech": "cs", "romanian": "ro", "danish": "da", "hungarian": "hu", "tamil": "ta", "norwegian": "no",
    "thai": "th", "urdu": "ur", "croatian": "hr", "bulgarian": "bg", "lithuanian": "lt", "latin": "la",
    "welsh": "cy", "slovak": "sk", "persian": "fa", "latvian": "lv", "bengali": "bn", "serbian": "sr",
    "slovenian": "sl", "estonian": "et", "icelandic": "is", "swahili": "sw", "cantonese": "yue",
}
