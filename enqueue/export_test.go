package enqueue

// DecodeMessageJSON is DecodeMessage without its fast path, for the fuzz
// target to hold the two to the same answers.
func DecodeMessageJSON(body string) (Message, error) {
	if len(body) > MaxBodyBytes {
		return DecodeMessage(body)
	}
	return decodeJSON(body)
}
