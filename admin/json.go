package admin

import (
	"bytes"
	"encoding/json"
	"errors"
)

// strictUnmarshal decodes one JSON value from b into v, refusing unknown
// fields and trailing data.
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
